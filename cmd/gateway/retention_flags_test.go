package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/eventlog"
)

// parseRetentionFlags parses args with the retention flags only.
func parseRetentionFlags(t *testing.T, args ...string) (eventlog.Options, error) {
	t.Helper()
	fs := newFlags("serve", "gateway serve", "help")
	build := retentionFlags(fs)
	if code, ok := fs.parse(args); !ok {
		t.Fatalf("parse %v: exit %d", args, code)
	}
	return build()
}

// TestRetainMinFlags: the retention floor in time and bytes, and the old
// flag name of its time.
func TestRetainMinFlags(t *testing.T) {
	o, err := parseRetentionFlags(t, "--retain-min", "2h", "--retain-min-bytes", "1GiB")
	if err != nil || o.MinAge != 2*time.Hour || o.MinBytes != 1<<30 || o.NoMinBytes {
		t.Fatalf("got %+v, %v", o, err)
	}
	if o, err := parseRetentionFlags(t, "--retention-min-age", "3h"); err != nil || o.MinAge != 3*time.Hour {
		t.Fatalf("--retention-min-age 3h: got %+v, %v", o, err)
	}
	if o, err := parseRetentionFlags(t, "--retention-index-buckets", "64", "--retention-cost-model=false"); err != nil || o.IndexBuckets != 64 || !o.DisableCostModel {
		t.Fatalf("index buckets and cost model: got %+v, %v", o, err)
	}
}

// TestRetentionFlags: every retention threshold is a flag with the draft's
// default and an environment variable (docs/retention.md, "Flags"), and the
// command line's "0 = none/off" maps onto eventlog.Options.
func TestRetentionFlags(t *testing.T) {
	parse := parseRetentionFlags
	t.Run("defaults", func(t *testing.T) {
		o, err := parse(t)
		if err != nil {
			t.Fatal(err)
		}
		want := eventlog.Options{InactiveAfter: 7 * 24 * time.Hour, SafetyMargin: 5, KeepNewest: 5, MinAge: time.Hour,
			MinBytes: 256 << 20, IndexBuckets: 16384, PruneInterval: time.Minute, TailEvents: 65536, TailBytes: 64 << 20}
		if !reflect.DeepEqual(o, want) {
			t.Fatalf("got %+v\nwant %+v", o, want)
		}
	})
	t.Run("zeros", func(t *testing.T) {
		o, err := parse(t, "--retention-adaptive=false", "--retention-safety-margin", "0", "--retention-keep-newest", "0",
			"--retain-min", "0", "--retain-min-bytes", "0", "--retention-cost-model=false", "--retention-max-age", "72h", "--retention-max-bytes", "1GiB")
		if err != nil {
			t.Fatal(err)
		}
		if !o.DisableAdaptive || !o.NoSafetyMargin || o.SafetyMargin != 0 || o.KeepNewest != 1 || o.MinAge != time.Nanosecond || !o.NoMinBytes || !o.DisableCostModel ||
			o.MaxAge != 72*time.Hour || o.MaxBytes != 1<<30 {
			t.Fatalf("got %+v", o)
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("GATEWAY_RETENTION_INACTIVE_AFTER", "48h")
		t.Setenv("GATEWAY_EVENT_TAIL_EVENTS", "1024")
		o, err := parse(t, "--retention-safety-margin", "9")
		if err != nil {
			t.Fatal(err)
		}
		if o.InactiveAfter != 48*time.Hour || o.TailEvents != 1024 || o.SafetyMargin != 9 {
			t.Fatalf("got %+v", o)
		}
	})
	for _, bad := range [][]string{{"--retention-inactive-after", "0"}, {"--retention-prune-interval", "0"},
		{"--event-tail-events", "0"}, {"--retain-min", "-1s"}, {"--retention-index-buckets", "2"}} {
		if _, err := parse(t, bad...); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("%v: got %v, want an error naming the flag", bad, err)
		}
	}
	fs := newFlags("serve", "gateway serve", "help")
	retentionFlags(fs)
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.Usage()
	for _, env := range []string{"GATEWAY_RETENTION_ADAPTIVE", "GATEWAY_RETENTION_INACTIVE_AFTER", "GATEWAY_RETENTION_SAFETY_MARGIN",
		"GATEWAY_RETENTION_KEEP_NEWEST", "GATEWAY_RETENTION_MIN_AGE", "GATEWAY_RETENTION_MAX_AGE", "GATEWAY_RETENTION_MAX_BYTES",
		"GATEWAY_RETENTION_PRUNE_INTERVAL", "GATEWAY_EVENT_TAIL_EVENTS", "GATEWAY_EVENT_TAIL_BYTES"} {
		if !strings.Contains(help.String(), "[$"+env+"]") {
			t.Errorf("help does not name %s", env)
		}
	}
}
