package quicpeer_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// TestStatelessResetAfterRestart: a server that crashes (no
// CONNECTION_CLOSE) and comes back on the same UDP port with the same
// Config.StatelessResetKey answers the client's next packet with a
// stateless reset (RFC 9000 Section 10.3), so the client's session ends at
// once instead of after the idle timeout. Without a key the restarted
// server stays silent and the dead session lives on.
func TestStatelessResetAfterRestart(t *testing.T) {
	key := [32]byte{1, 2, 3}
	for _, tc := range []struct {
		name string
		key  *[32]byte
	}{{"with key", &key}, {"without key", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			sr := newRecorder()
			sc := baseConfig(t, cborMode, sr, true)
			sc.StatelessResetKey = tc.key
			ln, err := quicpeer.Listen("127.0.0.1:0", sc)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			addr := ln.Addr().String()
			cr := newRecorder()
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			cc := baseConfig(t, cborMode, cr, false)
			// Well above the 3 s the test waits: only a reset may end
			// the session early here, not the idle timeout.
			cc.IdleTimeout = 30 * time.Second
			client, err := quicpeer.Dial(ctx, addr, cc)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { client.CloseWithError(wire.CodeNoError, "test done"); <-client.Done() }()
			if _, err := ln.Accept(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second) // QUIC's path MTU probes (large packets) are over

			ln.Crash()
			recv(t, sr.closed, "the crashed server session to end")
			sc2 := baseConfig(t, cborMode, newRecorder(), true)
			sc2.StatelessResetKey = tc.key
			ln2, err := quicpeer.Listen(addr, sc2)
			if err != nil {
				t.Fatalf("restart on %s: %v", addr, err)
			}
			defer ln2.Close()
			restarted := time.Now()

			// The client's next packet: a small entity (as the gateway
			// sending a chunk or a status).
			id, err := client.AssignID(ctx)
			if err != nil {
				t.Fatal(err)
			}
			payload := []byte("after the restart")
			_ = client.SendEntity(ctx, &wire.EntityHeader{EntityID: id, PayloadLength: uint64(len(payload))}, bytes.NewReader(payload))

			if tc.key == nil {
				select {
				case err := <-cr.closed:
					t.Fatalf("session ended %v after a restart without a reset key (%v): only the idle timeout may end it", time.Since(restarted), err)
				case <-time.After(3 * time.Second):
				}
				return
			}
			select {
			case err := <-cr.closed:
				var sre *quic.StatelessResetError
				if !errors.As(err, &sre) {
					t.Fatalf("session ended with %v, want a stateless reset", err)
				}
				t.Logf("client session ended %v after the restart: %v", time.Since(restarted), err)
			case <-time.After(3 * time.Second):
				t.Fatal("client session still up 3 s after the server restarted with the same reset key")
			}
		})
	}
}

// TestClientLiveness: the client's QUIC idle timeout is Config.IdleTimeout
// (3 s by default) with a PING after a third of it, whatever the
// keepalive, and never above 3 x keepalive (a dead peer is noticed within
// seconds even when the gateway has nothing to send; issue 22); the
// server keeps 3 x keepalive and keepalive/2 (Section 5.1.4,
// docs/profile.md 1) and ignores IdleTimeout.
func TestClientLiveness(t *testing.T) {
	for _, tc := range []struct {
		role        quicpeer.Role
		keepaliveMs uint64
		idleCfg     time.Duration
		idle, ping  time.Duration
	}{
		{quicpeer.RoleClient, 0, 0, 3 * time.Second, time.Second},
		{quicpeer.RoleClient, 0, 30 * time.Second, 30 * time.Second, 10 * time.Second},
		{quicpeer.RoleClient, 2000, 0, 3 * time.Second, time.Second},
		{quicpeer.RoleClient, 2000, time.Minute, 6 * time.Second, time.Second},
		{quicpeer.RoleServer, 0, 0, 90 * time.Second, 15 * time.Second},
		{quicpeer.RoleServer, 0, time.Second, 90 * time.Second, 15 * time.Second},
		{quicpeer.RoleServer, 2000, 0, 6 * time.Second, time.Second},
	} {
		c := baseConfig(t, cborMode, newRecorder(), tc.role == quicpeer.RoleServer)
		if tc.keepaliveMs != 0 {
			c.Offer.KeepaliveTimeoutMs = u64(tc.keepaliveMs)
		}
		c.IdleTimeout = tc.idleCfg
		idle, ping, err := quicpeer.QUICTimers(c, tc.role)
		if err != nil {
			t.Fatal(err)
		}
		if idle != tc.idle || ping != tc.ping {
			t.Errorf("role %d, keepalive %d ms, IdleTimeout %v: QUIC idle timeout %v, PING after %v; want %v, %v", tc.role, tc.keepaliveMs, tc.idleCfg, idle, ping, tc.idle, tc.ping)
		}
	}
}
