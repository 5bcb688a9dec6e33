package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/pipestream/gateway/bridge"
	"github.com/pipestream/gateway/bridge/store/pgstore"
)

// storeFlagHelp is the --store flag's help text.
const storeFlagHelp = "store backend: empty for SQLite in --data-dir, or postgres://user:password@host:port/database?sslmode=... for PostgreSQL shared by several gateways (docs/scale-out.md)"

// useStore sets bopts.Store to the --store backend (left nil for the
// default SQLite). The bridge owns it from then on: it closes it, also when
// bridge.New fails.
func useStore(ctx context.Context, bopts *bridge.Options, url string, log *slog.Logger) error {
	pg, err := openStore(ctx, url, log.With("component", "store"))
	if pg != nil {
		bopts.Store = pg
	}
	return err
}

// openStore opens the --store backend: nil for the default (SQLite, which
// the bridge opens in --data-dir), a PostgreSQL store for a postgres:// URL.
// Anything else is refused with what to write instead.
func openStore(ctx context.Context, url string, log *slog.Logger) (*pgstore.Store, error) {
	switch {
	case url == "" || url == "sqlite":
		return nil, nil
	case pgstore.IsURL(url):
		st, err := pgstore.Open(ctx, url, pgstore.Options{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		return st, nil
	}
	scheme, _, _ := strings.Cut(url, "://")
	return nil, fmt.Errorf("--store %q: unknown backend %q; use postgres://user:password@host:port/database, or leave it empty for SQLite in --data-dir", redactURL(url), scheme)
}

// redactURL hides a password in a URL for messages.
func redactURL(url string) string {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return url
	}
	userinfo, host, ok := strings.Cut(rest, "@")
	if !ok {
		return url
	}
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return scheme + "://" + user + ":***@" + host
	}
	return url
}
