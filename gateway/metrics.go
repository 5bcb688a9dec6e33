package gateway

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// grpcMetrics are the server-side RPC metrics, named and labelled like
// go-grpc-middleware's Prometheus provider so existing dashboards work:
// grpc_server_started_total, grpc_server_handled_total (with grpc_code),
// grpc_server_msg_received_total, grpc_server_msg_sent_total and the
// grpc_server_handling_seconds histogram.
type grpcMetrics struct {
	started  *prometheus.CounterVec
	handled  *prometheus.CounterVec
	received *prometheus.CounterVec
	sent     *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	panics   *prometheus.CounterVec
	rejected *prometheus.CounterVec
	// known reports whether a full method is registered; calls of other
	// methods (unknownMethod) are labelled "unknown", so a client cannot
	// add label values at will. nil: every method is known.
	known func(string) bool
}

// knownMethods returns whether a full method is one of srv's.
func knownMethods(srv *grpc.Server) func(string) bool {
	set := map[string]bool{}
	for svc, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			set["/"+svc+"/"+m.Name] = true
		}
	}
	return func(m string) bool { return set[m] }
}

func newGRPCMetrics(reg prometheus.Registerer) (*grpcMetrics, error) {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	m := &grpcMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total", Help: "RPCs started on the server."}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total", Help: "RPCs completed on the server, by status code."},
			append(append([]string{}, labels...), "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total", Help: "Stream messages received by the server."}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total", Help: "Stream messages sent by the server."}, labels),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Time from the start of an RPC to its completion, in seconds.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, labels),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_panics_recovered_total", Help: "Panics turned into codes.Internal by the recovery interceptor."},
			[]string{"grpc_method"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pipestream_gateway_rejected_total", Help: "Calls refused before the handler: unauthenticated, limiter, rate, concurrency, smuggling, connections_per_ip, connections_total, malformed_method_name (a gRPC :path that is not /service/method), deadline_exceeded (a gRPC call whose deadline passed before it arrived); h2_<frames>: an HTTP/2 connection cut by h2guard (h2_rst_stream, h2_rst_stream_tenant, h2_settings, h2_ping, h2_tenant_cooldown, h2_cooldown)."},
			[]string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.started, err = register(reg, m.started); err != nil {
		return nil, err
	}
	if m.handled, err = register(reg, m.handled); err != nil {
		return nil, err
	}
	if m.received, err = register(reg, m.received); err != nil {
		return nil, err
	}
	if m.sent, err = register(reg, m.sent); err != nil {
		return nil, err
	}
	if m.latency, err = register(reg, m.latency); err != nil {
		return nil, err
	}
	if m.panics, err = register(reg, m.panics); err != nil {
		return nil, err
	}
	if m.rejected, err = register(reg, m.rejected); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector already registered under
// the same name (two servers sharing one registry share the metrics).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}

// splitMethod turns "/pkg.Service/Method" into ("pkg.Service", "Method").
func splitMethod(full string) (string, string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", full
}

func (m *grpcMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	svc, meth := splitMethod(info.FullMethod)
	m.started.WithLabelValues("unary", svc, meth).Inc()
	m.received.WithLabelValues("unary", svc, meth).Inc()
	start := time.Now()
	resp, err := h(ctx, req)
	m.latency.WithLabelValues("unary", svc, meth).Observe(time.Since(start).Seconds())
	m.handled.WithLabelValues("unary", svc, meth, status.Code(err).String()).Inc()
	if err == nil {
		m.sent.WithLabelValues("unary", svc, meth).Inc()
	}
	return resp, err
}

func (m *grpcMetrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	svc, meth := splitMethod(info.FullMethod)
	if m.known != nil && !m.known(info.FullMethod) {
		svc, meth = "unknown", "unknown"
	}
	typ := "bidi_stream"
	switch {
	case info.IsClientStream && !info.IsServerStream:
		typ = "client_stream"
	case !info.IsClientStream && info.IsServerStream:
		typ = "server_stream"
	}
	m.started.WithLabelValues(typ, svc, meth).Inc()
	start := time.Now()
	err := h(srv, &countingStream{
		ServerStream: ss,
		recv:         m.received.WithLabelValues(typ, svc, meth),
		sent:         m.sent.WithLabelValues(typ, svc, meth),
	})
	m.latency.WithLabelValues(typ, svc, meth).Observe(time.Since(start).Seconds())
	m.handled.WithLabelValues(typ, svc, meth, status.Code(err).String()).Inc()
	return err
}

type countingStream struct {
	grpc.ServerStream
	recv, sent prometheus.Counter
}

func (c *countingStream) RecvMsg(m any) error {
	err := c.ServerStream.RecvMsg(m)
	if err == nil {
		c.recv.Inc()
	}
	return err
}

func (c *countingStream) SendMsg(m any) error {
	err := c.ServerStream.SendMsg(m)
	if err == nil {
		c.sent.Inc()
	}
	return err
}
