package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
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
// Tickets live in memory only; at most maxTickets are outstanding (429
// above that). The store keeps SHA-256 of each ticket, not the ticket.

const (
	ticketTTL  = 30 * time.Second
	maxTickets = 10000
)

// ReasonInvalidTicket is the ErrorInfo reason for an unknown, used or
// expired WebSocket ticket.
const ReasonInvalidTicket = "INVALID_TICKET"

type ticket struct {
	tenant  bridge.Tenant
	token   string // the bearer token it was issued for ("" without tokens)
	expires time.Time
}

// ticketStore holds the outstanding tickets.
type ticketStore struct {
	mu      sync.Mutex
	tickets map[[sha256.Size]byte]ticket
}

func newTicketStore() *ticketStore {
	return &ticketStore{tickets: map[[sha256.Size]byte]ticket{}}
}

var errTooManyTickets = status.Error(codes.ResourceExhausted, "too many outstanding WebSocket tickets; use one before asking for more")

// issue returns a new ticket for tenant, authenticated by token.
func (ts *ticketStore) issue(tenant bridge.Tenant, token string) (string, error) {
	var raw [32]byte
	_, _ = rand.Read(raw[:]) // crypto/rand never fails on supported platforms
	id := base64.RawURLEncoding.EncodeToString(raw[:])
	now := time.Now()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if len(ts.tickets) >= maxTickets {
		ts.pruneLocked(now)
		if len(ts.tickets) >= maxTickets {
			return "", errTooManyTickets
		}
	}
	ts.tickets[sha256.Sum256([]byte(id))] = ticket{tenant: tenant, token: token, expires: now.Add(ticketTTL)}
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
	delete(ts.tickets, key)
	if !ok || !now.Before(t.expires) {
		return ticket{}, false
	}
	return t, true
}

func (ts *ticketStore) pruneLocked(now time.Time) {
	for k, t := range ts.tickets {
		if !now.Before(t.expires) {
			delete(ts.tickets, k)
		}
	}
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
		if !q.Has("ticket") {
			next(w, r)
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
			preUpgradeError(w, http.StatusUnauthorized, statusError(codes.Unauthenticated, ReasonInvalidTicket,
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
