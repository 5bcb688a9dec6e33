package main

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/gateway"
)

// parseServe parses args as `gateway serve` does and builds its config.
func parseServe(t *testing.T, args ...string) *serveFlags {
	t.Helper()
	f, code, ok := parseServeFlags(args)
	if !ok {
		t.Fatalf("parse %v: exit %d", args, code)
	}
	return f
}

// limits are the gateway Config fields whose flag takes 0 for unlimited.
func limits(c gateway.Config) map[string]float64 {
	return map[string]float64{
		"RateLimit":               c.RateLimit,
		"MaxUploadsPerTenant":     float64(c.MaxUploadsPerTenant),
		"MaxSubscribersPerTenant": float64(c.MaxSubscribersPerTenant),
		"MaxDownloadsPerTenant":   float64(c.MaxDownloadsPerTenant),
		"MaxClientIDsPerTenant":   float64(c.MaxClientIDsPerTenant),
		"MaxTicketsPerTenant":     float64(c.MaxTicketsPerTenant),
		"MinFreeDiskBytes":        float64(c.MinFreeDiskBytes),
		"MinBodyRate":             float64(c.MinBodyRate),
		"MaxConnsPerIP":           float64(c.MaxConnsPerIP),
	}
}

// TestServeLimitFlags: each of serve's "0 = unlimited" flags reaches the
// gateway Config as its "negative = unlimited" (a 0 there would take the
// default instead), other values pass unchanged, and no flag given keeps
// the gateway's defaults.
func TestServeLimitFlags(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Run("defaults", func(t *testing.T) {
		got := limits(parseServe(t).gatewayConfig(log))
		want := map[string]float64{
			"RateLimit":               gateway.DefaultRateLimit,
			"MaxUploadsPerTenant":     gateway.DefaultMaxUploadsPerTenant,
			"MaxSubscribersPerTenant": gateway.DefaultMaxSubscribersPerTenant,
			"MaxDownloadsPerTenant":   gateway.DefaultMaxDownloadsPerTenant,
			"MaxClientIDsPerTenant":   gateway.DefaultMaxClientIDsPerTenant,
			"MaxTicketsPerTenant":     gateway.DefaultMaxTicketsPerTenant,
			"MinFreeDiskBytes":        gateway.DefaultMinFreeDiskBytes,
			"MinBodyRate":             gateway.DefaultMinBodyRate,
			"MaxConnsPerIP":           gateway.DefaultMaxConnsPerIP,
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("defaults:\n got %v\nwant %v", got, want)
		}
	})
	t.Run("zeros are unlimited", func(t *testing.T) {
		got := limits(parseServe(t, "--rate-limit", "0", "--max-uploads-per-tenant", "0",
			"--max-subscribers-per-tenant", "0", "--max-downloads-per-tenant", "0", "--max-client-ids-per-tenant", "0",
			"--max-tickets-per-tenant", "0", "--min-free-disk", "0", "--min-body-rate", "0", "--max-conns-per-ip", "0").gatewayConfig(log))
		for name, v := range got {
			if v != -1 {
				t.Errorf("%s = %v after its flag was 0, want -1 (unlimited)", name, v)
			}
		}
	})
	t.Run("values pass", func(t *testing.T) {
		got := limits(parseServe(t, "--rate-limit", "2.5", "--max-uploads-per-tenant", "3",
			"--max-subscribers-per-tenant", "4", "--max-downloads-per-tenant", "5", "--max-client-ids-per-tenant", "6",
			"--max-tickets-per-tenant", "7", "--min-free-disk", "8", "--min-body-rate", "9", "--max-conns-per-ip", "10").gatewayConfig(log))
		want := map[string]float64{"RateLimit": 2.5, "MaxUploadsPerTenant": 3, "MaxSubscribersPerTenant": 4,
			"MaxDownloadsPerTenant": 5, "MaxClientIDsPerTenant": 6, "MaxTicketsPerTenant": 7, "MinFreeDiskBytes": 8,
			"MinBodyRate": 9, "MaxConnsPerIP": 10}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("values:\n got %v\nwant %v", got, want)
		}
	})
}

// TestServeConfigSteps: the config step carries the flags into the bridge
// and serve parts, clamps what the types bound, and reports a bad flag.
func TestServeConfigSteps(t *testing.T) {
	f := parseServe(t, "--data-dir", "/tmp/x", "--peer-draft04-conns", "2000000", "--max-recv-msg-bytes", "8GiB",
		"--max-conns", "99999999", "--cors-origins", "https://a.example,https://b.example", "--shutdown-timeout", "3s")
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Bridge.DataDir != "/tmp/x" || cfg.Gateway.DataDir != "/tmp/x" {
		t.Errorf("data dir: bridge %q, gateway %q", cfg.Bridge.DataDir, cfg.Gateway.DataDir)
	}
	if cfg.Bridge.PeerDraft04Conns != 1<<20 {
		t.Errorf("PeerDraft04Conns = %d for 2000000, want it clamped to 2^20 (the bridge then refuses it)", cfg.Bridge.PeerDraft04Conns)
	}
	if cfg.Gateway.MaxRecvMsgBytes != 1<<31-1 || cfg.Gateway.MaxConns != 1<<24 {
		t.Errorf("clamps: MaxRecvMsgBytes %d, MaxConns %d", cfg.Gateway.MaxRecvMsgBytes, cfg.Gateway.MaxConns)
	}
	if got := cfg.Gateway.CORSOrigins; len(got) != 2 || got[1] != "https://b.example" {
		t.Errorf("CORSOrigins = %q", got)
	}
	if cfg.ShutdownTimeout.String() != "3s" || cfg.Logger == nil || cfg.Gateway.Logger != cfg.Logger {
		t.Errorf("shutdown %v, logger %v / %v", cfg.ShutdownTimeout, cfg.Logger, cfg.Gateway.Logger)
	}
	if _, err := parseServe(t, "--log-level", "loud").config(); err == nil {
		t.Error("--log-level loud accepted")
	}
	if _, err := parseServe(t, "--peer-profile", "sometimes").config(); err == nil {
		t.Error("--peer-profile sometimes accepted")
	}
}

// --create-hold: 0 turns the hold off (the bridge's negative), the default
// and a value pass through, a negative value is refused with what to use.
func TestServeCreateHold(t *testing.T) {
	for _, c := range []struct {
		arg  string
		want time.Duration
	}{{"0", -1}, {"20ms", 20 * time.Millisecond}, {"1s", time.Second}} {
		cfg, err := parseServe(t, "--data-dir", "/tmp/x", "--create-hold", c.arg).config()
		if err != nil {
			t.Fatalf("--create-hold %s: %v", c.arg, err)
		}
		if cfg.Bridge.CreateHold != c.want {
			t.Errorf("--create-hold %s: CreateHold %v, want %v", c.arg, cfg.Bridge.CreateHold, c.want)
		}
	}
	if _, err := parseServe(t, "--data-dir", "/tmp/x", "--create-hold", "-5ms").config(); err == nil || !strings.Contains(err.Error(), "0 turns the hold off") {
		t.Errorf("--create-hold -5ms: %v, want a refusal that says how to turn it off", err)
	}
}
