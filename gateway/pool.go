package gateway

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"

	"github.com/pipestream/gateway/bridge"
)

// connPool is the REST proxy's view of the gRPC listener for the streams
// that do not run in-process (watch; unary calls, event subscriptions and
// the raw-body upload run in-process: inproc.go, localstream.go,
// localupload.go). Every tenant gets its own connection (a lane), dialed on
// its first stream and closed by gRPC's idle mode after proxyLaneIdle
// without calls: a tenant's streams can wait only for slots and
// flow-control windows of its own lane, never for another tenant's, so
// no sum of per-tenant stream caps can starve anyone (issue 22). Calls
// whose tenant is unknown (a request that will fail authentication)
// share one more connection. Every connection has fixed flow-control
// windows (proxyStreamWindow per stream; no BDP growth), so a stream
// whose HTTP client stopped reading holds at most that much in the proxy.
// Lanes are bounded by the tenants the Authenticator knows, as the
// per-tenant limits are.
type connPool struct {
	target   string
	opts     []grpc.DialOption
	tenantOf func(context.Context) (bridge.Tenant, bool)

	mu     sync.Mutex
	lanes  map[bridge.Tenant]*grpc.ClientConn
	anon   *grpc.ClientConn
	closed bool
}

var _ grpc.ClientConnInterface = (*connPool)(nil)

func newConnPool(target string, tenantOf func(context.Context) (bridge.Tenant, bool), opts ...grpc.DialOption) (*connPool, error) {
	p := &connPool{target: target, tenantOf: tenantOf, lanes: map[bridge.Tenant]*grpc.ClientConn{},
		opts: append([]grpc.DialOption{grpc.WithIdleTimeout(proxyLaneIdle)}, opts...)}
	c, err := grpc.NewClient(target, p.opts...)
	if err != nil {
		return nil, err
	}
	c.Connect()
	p.anon = c
	return p, nil
}

// Invoke is not used for REST (unary calls run in-process); it goes over
// the tenant's lane like a stream.
func (p *connPool) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	c, err := p.lane(ctx)
	if err != nil {
		return err
	}
	return c.Invoke(ctx, method, args, reply, opts...)
}

func (p *connPool) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	c, err := p.lane(ctx)
	if err != nil {
		return nil, err
	}
	return c.NewStream(ctx, desc, method, opts...)
}

// lane returns the connection of the call's tenant, dialing it on first
// use.
func (p *connPool) lane(ctx context.Context) (*grpc.ClientConn, error) {
	t, ok := p.tenantOf(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("gateway: REST proxy closed")
	}
	if !ok {
		return p.anon, nil
	}
	if c := p.lanes[t]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(p.target, p.opts...) // does not connect: no I/O under the lock
	if err != nil {
		return nil, err
	}
	p.lanes[t] = c
	return c, nil
}

// Close closes every connection (outside the lock: closing writes a
// GOAWAY).
func (p *connPool) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := []*grpc.ClientConn{p.anon}
	for _, c := range p.lanes {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	var errs []error
	for _, c := range conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
