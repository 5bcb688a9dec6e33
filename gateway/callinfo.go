package gateway

import (
	"context"

	"github.com/pipestream/gateway/bridge"
)

// callInfo is the per-call record the interceptors share: the request id
// interceptor creates it, auth fills in the tenant, logging reads both after
// the handler returned.
type callInfo struct {
	requestID string
	tenant    bridge.Tenant
}

type callInfoKey struct{}

func withCallInfo(ctx context.Context, ci *callInfo) context.Context {
	return context.WithValue(ctx, callInfoKey{}, ci)
}

func callInfoFrom(ctx context.Context) *callInfo {
	ci, _ := ctx.Value(callInfoKey{}).(*callInfo)
	return ci
}

// TenantFromContext returns the tenant the auth interceptor established for
// this call ("" for an unauthenticated deployment).
func TenantFromContext(ctx context.Context) bridge.Tenant {
	if ci := callInfoFrom(ctx); ci != nil {
		return ci.tenant
	}
	return ""
}

// requestIDOf returns the request id of the call ctx belongs to ("" outside one).
func requestIDOf(ctx context.Context) string {
	if ci := callInfoFrom(ctx); ci != nil {
		return ci.requestID
	}
	return ""
}
