package serve

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/pipestream/gateway/gateway"
)

// notifyContext is ctx ended by the first SIGINT/SIGTERM (the start of a
// graceful shutdown). A second signal after that ends the process at once
// with exit status 1, as Go tools and servers do. One channel receives
// both signals, so none falls through to the default action in between.
// stop releases the signals and the watching goroutine.
func notifyContext(parent context.Context, log *slog.Logger) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sig:
			log.Info("signal received: graceful stop begins; a second signal exits at once", "signal", s.String())
			cancel()
		case <-done:
			return
		}
		select {
		case <-sig:
			log.Warn("second signal: exiting now without finishing the graceful shutdown")
			os.Exit(1)
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sig)
			cancel()
			close(done)
		})
	}
}

// loadTokens loads the token file, reloads it when it changes (polled)
// and on SIGHUP until ctx ends.
func loadTokens(ctx context.Context, path string, log *slog.Logger) (*gateway.TokenFile, error) {
	tf, err := gateway.LoadTokenFile(path, log.With("component", "auth"))
	if err != nil {
		return nil, fmt.Errorf("--auth-tokens: %w", err)
	}
	if tf.Len() == 0 {
		log.Warn("the token file has no entries: every API call will be refused until lines from 'gateway hash-token' are added", "path", path)
	}
	go tf.Watch(ctx, gateway.DefaultTokenPollInterval)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = tf.Reload()
			}
		}
	}()
	log.Info("bearer token authentication on", "tokens", tf.Len(), "file", path)
	return tf, nil
}
