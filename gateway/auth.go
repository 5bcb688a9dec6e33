package gateway

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/pipestream/gateway/bridge"
)

// Authenticator maps a bearer token to a tenant. token is the credential of
// the "authorization: Bearer <token>" metadata (REST: the Authorization
// header), "" when the caller sent none. Return an error with codes.
// Unauthenticated (or PermissionDenied) to reject the call; any other error
// is reported as Unauthenticated.
//
// It runs last in the interceptor chain, for every RPC except
// grpc.health.v1 and server reflection.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (bridge.Tenant, error)
}

// NoAuth accepts every call as the single tenant "" (an unauthenticated,
// loopback-only deployment). It is the default Authenticator.
type NoAuth struct{}

// Authenticate implements Authenticator.
func (NoAuth) Authenticate(context.Context, string) (bridge.Tenant, error) { return "", nil }

// StaticTokens is an Authenticator over a fixed token -> tenant table, the
// building block for a tokens file. Tokens are compared in constant time.
type StaticTokens map[string]bridge.Tenant

// Authenticate implements Authenticator.
func (s StaticTokens) Authenticate(_ context.Context, token string) (bridge.Tenant, error) {
	if token == "" {
		return "", errMissingToken
	}
	for known, tenant := range s {
		if subtle.ConstantTimeCompare([]byte(known), []byte(token)) == 1 {
			return tenant, nil
		}
	}
	return "", errUnknownToken
}

// Limiter is the hook for per-tenant rate limits and quotas. Allow runs right
// after authentication; a non-nil error (use codes.ResourceExhausted with a
// RetryInfo detail) rejects the call. nil Config.Limiter allows everything.
type Limiter interface {
	Allow(ctx context.Context, tenant bridge.Tenant, fullMethod string) error
}

// bearerToken extracts the token from incoming "authorization" metadata.
func bearerToken(ctx context.Context) string {
	// One key's values, not FromIncomingContext's copy of every key (a
	// REST call carries a dozen forwarded headers).
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			return strings.TrimSpace(v[7:])
		}
	}
	return ""
}

// skipAuth reports whether the method is exempt from authentication:
// health checks and server reflection.
func skipAuth(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(fullMethod, "/grpc.reflection.")
}
