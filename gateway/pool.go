package gateway

import (
	"context"
	"errors"
	"sync/atomic"

	"google.golang.org/grpc"
)

// connPool is the REST proxy's view of the gRPC listener: unary calls go
// over their own connection, streams (watch, subscribe, upload, WebSocket)
// round-robin over proxyStreamConns others, so no REST call queues behind
// long-lived streams for an HTTP/2 stream slot or connection window, and
// the slots available to streams are proxyStreamConns x
// MaxConcurrentStreams. Every connection has fixed flow-control windows
// (proxyStreamWindow per stream; no BDP growth), so a stream whose HTTP
// client stopped reading holds at most that much in the proxy.
type connPool struct {
	unary   *grpc.ClientConn
	streams []*grpc.ClientConn
	next    atomic.Uint64
}

var _ grpc.ClientConnInterface = (*connPool)(nil)

func newConnPool(target string, n int, opts ...grpc.DialOption) (*connPool, error) {
	p := &connPool{}
	for i := 0; i <= n; i++ {
		c, err := grpc.NewClient(target, opts...)
		if err != nil {
			p.Close()
			return nil, err
		}
		c.Connect() // all at start: no connection appears under load
		if i == 0 {
			p.unary = c
		} else {
			p.streams = append(p.streams, c)
		}
	}
	return p, nil
}

func (p *connPool) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return p.unary.Invoke(ctx, method, args, reply, opts...)
}

func (p *connPool) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	c := p.streams[p.next.Add(1)%uint64(len(p.streams))]
	return c.NewStream(ctx, desc, method, opts...)
}

// Close closes every connection.
func (p *connPool) Close() error {
	var errs []error
	if p.unary != nil {
		errs = append(errs, p.unary.Close())
	}
	for _, c := range p.streams {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
