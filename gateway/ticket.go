package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge"
)

// WebSocket tickets. Browsers cannot send an Authorization header on a
// WebSocket upgrade, so a client that holds a bearer token first asks for a
// ticket over an authenticated request and then opens the socket with it:
//
//	POST /v1/events:ticket            (Authorization: Bearer <token>)
//	  -> 200 {"ticket": "<43 chars>", "expiresInSeconds": 30}
//	GET  /v1/events/ws?ticket=<ticket>&cursor=...
//
// A ticket is an opaque 256-bit random value, valid for ticketTTL, accepted
// once, and bound to the tenant that asked for it: the upgrade runs as that
// tenant (the token it was issued for is authenticated again, so a token
// removed from the token file in the meantime fails, and a token that now
// maps to another tenant is refused). An unknown, used or expired ticket
// answers 401 before the upgrade. Without tokens (loopback mode) the
// ticket works the same for the single tenant "".
//
// Tickets live in memory only; each tenant has at most
// Config.MaxTicketsPerTenant outstanding (--max-tickets-per-tenant; 429
// TOO_MANY_TICKETS with Retry-After until its oldest expires above that).
// There is no server-wide cap that tenants share: a tenant at its cap
// holds its own tickets only, and the tenant set is bounded by the
// configured tokens, as the other per-tenant limits are (issue 22). The
// store keeps SHA-256 of each ticket, not the ticket.

const ticketTTL = 30 * time.Second

// Error reasons of tickets: an unknown, used or expired WebSocket
// ticket; a tenant at its outstanding-ticket cap.
const (
	ReasonInvalidTicket  = "INVALID_TICKET"
	ReasonTooManyTickets = "TOO_MANY_TICKETS"
)

type ticket struct {
	tenant  bridge.Tenant
	token   string // the bearer token it was issued for ("" without tokens)
	expires time.Time
}

// ticketStore holds the outstanding tickets, and per tenant the keys of
// its own (at most perTenant each).
type ticketStore struct {
	perTenant int // <= 0: no cap

	mu       sync.Mutex
	tickets  map[[sha256.Size]byte]ticket
	byTenant map[bridge.Tenant]map[[sha256.Size]byte]time.Time
}

func newTicketStore(perTenant int) *ticketStore {
	return &ticketStore{perTenant: perTenant, tickets: map[[sha256.Size]byte]ticket{},
		byTenant: map[bridge.Tenant]map[[sha256.Size]byte]time.Time{}}
}

// issue returns a new ticket for tenant, authenticated by token, or
// TOO_MANY_TICKETS when tenant has perTenant outstanding.
func (ts *ticketStore) issue(tenant bridge.Tenant, token string) (string, error) {
	var raw [32]byte
	_, _ = rand.Read(raw[:]) // crypto/rand never fails on supported platforms
	id := base64.RawURLEncoding.EncodeToString(raw[:])
	key := sha256.Sum256([]byte(id))
	now := time.Now()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	mine := ts.byTenant[tenant]
	if ts.perTenant > 0 && len(mine) >= ts.perTenant {
		oldest := ts.pruneLocked(tenant, now)
		if len(ts.byTenant[tenant]) >= ts.perTenant {
			return "", limitError(ReasonTooManyTickets, oldest.Sub(now), fmt.Sprintf(
				"this tenant has %d outstanding WebSocket tickets, its limit (--max-tickets-per-tenant); use one, or retry when the oldest expires in %s",
				ts.perTenant, roundUp(oldest.Sub(now))))
		}
	}
	if ts.byTenant[tenant] == nil {
		ts.byTenant[tenant] = map[[sha256.Size]byte]time.Time{}
	}
	exp := now.Add(ticketTTL)
	ts.tickets[key] = ticket{tenant: tenant, token: token, expires: exp}
	ts.byTenant[tenant][key] = exp
	return id, nil
}

// redeem consumes a ticket: it is gone afterwards whether it was valid or
// not. ok is false for an unknown, used or expired ticket.
func (ts *ticketStore) redeem(id string) (ticket, bool) {
	key := sha256.Sum256([]byte(id))
	now := time.Now()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.tickets[key]
	if ok {
		ts.forgetLocked(t.tenant, key)
	}
	if !ok || !now.Before(t.expires) {
		return ticket{}, false
	}
	return t, true
}

func (ts *ticketStore) forgetLocked(tenant bridge.Tenant, key [sha256.Size]byte) {
	delete(ts.tickets, key)
	if mine := ts.byTenant[tenant]; mine != nil {
		delete(mine, key)
		if len(mine) == 0 {
			delete(ts.byTenant, tenant)
		}
	}
}

// pruneLocked drops tenant's expired tickets and returns when its oldest
// remaining one expires (now when none remains).
func (ts *ticketStore) pruneLocked(tenant bridge.Tenant, now time.Time) time.Time {
	oldest := time.Time{}
	for k, exp := range ts.byTenant[tenant] {
		if !now.Before(exp) {
			ts.forgetLocked(tenant, k)
			continue
		}
		if oldest.IsZero() || exp.Before(oldest) {
			oldest = exp
		}
	}
	if oldest.IsZero() {
		return now
	}
	return oldest
}

// outstanding is the number of stored tickets (tests).
func (ts *ticketStore) outstanding() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.tickets)
}

// handleTicket serves POST /v1/events:ticket. It authenticates like every
// API call (bearer token, Config.Limiter, the tenant's rate limit).
func (s *Server) handleTicket(ts *ticketStore) http.HandlerFunc {
	const method = "/pipestream.gateway.v1.EventService/SubscribeEvents"
	return func(w http.ResponseWriter, r *http.Request) {
		token := headerBearer(r)
		tenant, err := s.authenticate(withAuthorization(r.Context(), token), method)
		if err == nil {
			var id string
			if id, err = ts.issue(tenant, token); err == nil {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Cache-Control", "no-store")
				_ = json.NewEncoder(w).Encode(map[string]any{"ticket": id, "expiresInSeconds": int(ticketTTL / time.Second)})
				return
			}
		}
		st := status.Convert(err)
		errorHeaders(w.Header(), err)
		s.writeStatus(w, r, runtime.HTTPStatusFromCode(st.Code()), err)
	}
}

// withTickets lets next (the WebSocket route) accept ?ticket= instead of
// the Authorization header: a valid ticket becomes its token's
// Authorization header, anything else answers 401 before the upgrade.
func (s *Server) withTickets(ts *ticketStore, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if !q.Has("ticket") || !wsHandshake(r) {
			next(w, r) // a request that is no handshake is answered 426 without spending the ticket
			return
		}
		if !s.wsOriginAllowed(r) {
			// Refused before the ticket is looked at: a page of a foreign
			// origin cannot spend (or probe) another page's ticket.
			s.preUpgradeError(w, r, http.StatusForbidden, status.Error(codes.PermissionDenied, wsRejectMessage(http.StatusForbidden,
				fmt.Errorf("request Origin %q is not authorized for Host %q", r.Header.Get("Origin"), r.Host))))
			return
		}
		t, ok := ts.redeem(q.Get("ticket"))
		if ok {
			// The ticket's token must still authenticate as its tenant.
			tenant, err := s.cfg.Authenticator.Authenticate(withAuthorization(r.Context(), t.token), t.token)
			ok = err == nil && tenant == t.tenant
		}
		if !ok {
			s.metrics.rejected.WithLabelValues("unauthenticated").Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="pipestream", error="invalid_token"`)
			s.preUpgradeError(w, r, http.StatusUnauthorized, statusError(codes.Unauthenticated, ReasonInvalidTicket,
				"the WebSocket ticket is unknown, used or expired: get a new one with POST /v1/events:ticket (tickets are single-use and valid 30 s)"))
			return
		}
		r = r.Clone(r.Context())
		q.Del("ticket")
		r.URL.RawQuery = q.Encode()
		r.Header.Del("Authorization")
		if t.token != "" {
			r.Header.Set("Authorization", "Bearer "+t.token)
		}
		next(w, r)
	}
}

// headerBearer is the token of an "Authorization: Bearer <token>" header
// ("" when there is none).
func headerBearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// withAuthorization returns ctx with token as incoming authorization
// metadata, as the gRPC interceptors see it.
func withAuthorization(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
}
