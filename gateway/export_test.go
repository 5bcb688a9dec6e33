package gateway

import "google.golang.org/grpc"

// UTF8Interceptors returns the gRPC interceptors that refuse invalid UTF-8
// in requests and clean status messages.
func UTF8Interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return utf8Unary, utf8Stream
}

// SetMaxUnarySnapshotBytes lowers GetSnapshot's one-message limit for a
// test and returns a function that restores it.
func SetMaxUnarySnapshotBytes(n int) func() {
	old := maxUnarySnapshotBytes
	maxUnarySnapshotBytes = n
	return func() { maxUnarySnapshotBytes = old }
}

// RecvSlack is how far past --max-recv-msg-bytes grpc-go itself refuses
// a message (wireerrors.go).
const RecvSlack = recvSlack

// GRPCServer is the gRPC server behind the listener, for a benchmark that
// serves it another way too (grpc.Server.ServeHTTP).
func GRPCServer(s *Server) *grpc.Server { return s.grpc }
