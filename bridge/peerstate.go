package bridge

import (
	"context"
	"fmt"
	"time"

	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
	"github.com/pipestream/gateway/quicpeer"
	"github.com/pipestream/gateway/quicpeer/wire"
)

// ProfileMode says whether documents use this project's profile toward the
// peer (docs/profile.md 1.1).
type ProfileMode int

const (
	// ProfileAuto uses the profile when the peer answers the discovery
	// member of CAPABILITIES (this project's peer does; a draft-04 peer
	// never gets it).
	ProfileAuto ProfileMode = iota
	// ProfileOn uses the profile whatever the peer answers (draft-02 only).
	ProfileOn
	// ProfileOff sends plain entities (docs/profile.md 9).
	ProfileOff
)

// ParseProfileMode parses "auto", "on" or "off".
func ParseProfileMode(s string) (ProfileMode, error) {
	switch s {
	case "auto":
		return ProfileAuto, nil
	case "on":
		return ProfileOn, nil
	case "off":
		return ProfileOff, nil
	}
	return 0, fmt.Errorf("unknown profile mode %q: use auto, on or off", s)
}

// ParseFraming parses "auto", "draft-02" or "draft-04".
func ParseFraming(s string) (quicpeer.Framing, error) {
	switch s {
	case "auto":
		return quicpeer.FramingAuto, nil
	case "draft-02":
		return quicpeer.FramingDraft02, nil
	case "draft-04":
		return quicpeer.FramingDraft04, nil
	}
	return 0, fmt.Errorf("unknown framing %q: use auto, draft-02 or draft-04", s)
}

// PeerStatus is the bridge's view of its peer (/healthz, the console).
type PeerStatus struct {
	Addr string `json:"addr"`
	// State: connected, connecting (no session yet, no failure),
	// idle (draft-04: a connection is opened per document), down.
	State     string `json:"state"`
	Framing   string `json:"framing"`
	Profile   bool   `json:"profile"`
	InFlight  int    `json:"inFlight"`
	Window    uint32 `json:"window"`
	LastError string `json:"lastError,omitempty"`
	// Since is when the last error happened (RFC 3339), if any.
	Since string `json:"since,omitempty"`
}

// peerState is what the bridge knows about its peer. Guarded by Bridge.mu.
type peerState struct {
	framing quicpeer.Framing // what the next dial uses
	lastErr string
	errAt   time.Time
	ok      bool // the last dial succeeded
}

// Peers returns the state of every peer (one today).
func (b *Bridge) Peers() []PeerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := PeerStatus{Addr: b.opts.PeerAddr, State: "connecting", Framing: framingName(b.peer.framing), LastError: b.peer.lastErr}
	if !b.peer.errAt.IsZero() {
		p.Since = b.peer.errAt.UTC().Format(time.RFC3339)
	}
	switch ss := b.active; {
	case ss != nil && !ss.closed:
		p.State, p.Framing, p.Profile = "connected", ss.s.Framing().String(), ss.profile
		p.InFlight, p.Window = len(ss.docs), ss.n.MaxWindow
	case b.peer.ok && b.peer.framing == quicpeer.FramingDraft04:
		p.State = "idle"
	case b.peer.lastErr != "":
		p.State = "down"
	}
	return []PeerStatus{p}
}

func framingName(f quicpeer.Framing) string { return f.String() }

// dialFraming is the framing of the next dial: the configured framing, or
// under auto what the peer has shown.
func (b *Bridge) dialFraming() quicpeer.Framing {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peer.framing
}

// noteDialLocked records a dial's outcome. Under auto framing a refused
// handshake (the peer closed the connection during the capability
// exchange, as a draft-04 peer does on a CAPABILITIES member it does not
// know) switches the next dial to the other framing.
func (b *Bridge) noteDialLocked(f quicpeer.Framing, err error) {
	if err == nil {
		b.peer.ok, b.peer.lastErr, b.peer.errAt = true, "", time.Time{}
		return
	}
	b.peer.ok = false
	b.peer.lastErr, b.peer.errAt = err.Error(), time.Now()
	if b.opts.PeerFraming != quicpeer.FramingAuto || !quicpeer.HandshakeRefused(err) {
		return
	}
	next := quicpeer.FramingDraft04
	if f == quicpeer.FramingDraft04 {
		next = quicpeer.FramingAuto
	}
	b.log.Info("bridge: the peer refused the handshake; trying the other framing", "addr", b.opts.PeerAddr, "next", framingName(next), "err", err)
	b.peer.framing = next
}

// learnSessionLocked takes what a new session shows: its framing (a
// draft-04 server detected on receipt) is kept for the next dials, and
// the profile is used only on draft-02 with the peer's consent (or when
// told to).
func (b *Bridge) learnSessionLocked(ss *sessState) {
	draft04 := ss.s.Framing() == wire.FramingDraft04
	if draft04 && b.opts.PeerFraming == quicpeer.FramingAuto {
		b.peer.framing = quicpeer.FramingDraft04
	}
	ss.draft04 = draft04
	switch b.opts.PeerProfile {
	case ProfileOn:
		ss.profile = !draft04
	case ProfileAuto:
		ss.profile = !draft04 && ss.n.Profile
	}
}

// waitReasonLocked says why queued documents wait, "" when nothing is
// known to hold them up.
func (b *Bridge) waitReasonLocked() string {
	if b.activeSessionLocked() != nil || (b.peer.ok && b.peer.framing == quicpeer.FramingDraft04) {
		return ""
	}
	if b.peer.lastErr == "" {
		return fmt.Sprintf("waiting for a session to the PipeStream peer %s: connecting, no answer yet", b.opts.PeerAddr)
	}
	return fmt.Sprintf("waiting for a session to the PipeStream peer %s (%s framing): %s (since %s)",
		b.opts.PeerAddr, framingName(b.peer.framing), b.peer.lastErr, b.peer.errAt.UTC().Format(time.RFC3339))
}

// superviseLoop enforces the bounds on waiting (docs/profile.md 9.3):
// every superviseInterval it marks why queued documents wait, fails those
// that waited PeerWait for a peer, and ends entities that exceeded their
// completion policy's timeout-ms (timeouts.go).
func (b *Bridge) superviseLoop(ctx context.Context) {
	defer b.wg.Done()
	t := time.NewTicker(superviseInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.mu.Lock()
		now := time.Now()
		b.superviseQueueLocked(now)
		b.superviseTimeoutsLocked(now)
		b.mu.Unlock()
	}
}

// superviseQueueLocked updates the wait reason of queued documents and
// fails the ones that waited longer than PeerWait for a session.
func (b *Bridge) superviseQueueLocked(now time.Time) {
	why := b.waitReasonLocked()
	for _, d := range b.queue {
		if d.terminal() || !d.queued {
			continue
		}
		if why != "" && now.Sub(d.queuedAt) < superviseInterval {
			continue // a document just queued is not held up yet
		}
		if d.rec.Doc.WaitReason != why {
			// A #document event carries the reason into the event log.
			d.rec.Doc.WaitReason = why
			d.addEvent(&gatewayv1.Event{Kind: kindDocument, State: d.rec.Doc.State, Message: why})
			b.kickFlush()
		}
		if why != "" && now.Sub(d.queuedAt) > b.opts.PeerWait {
			msg := fmt.Sprintf("no session to the PipeStream peer %s within %v (--peer-wait): %s", b.opts.PeerAddr, b.opts.PeerWait, why)
			b.failWaitingLocked(d, msg)
		}
	}
}

// failWaitingLocked fails a queued document that never got a session.
func (b *Bridge) failWaitingLocked(d *docRun, msg string) {
	d.rec.Doc.WaitReason = ""
	b.finishLocked(d, gatewayv1.State_FAILED, msg)
}
