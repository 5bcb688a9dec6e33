package gateway

import (
	"time"

	"google.golang.org/grpc"
)

// SetWebSocketWriteTimeout shortens the per-frame WebSocket write deadline
// (wsWriteTimeout) for a test and returns the function that restores it.
func SetWebSocketWriteTimeout(d time.Duration) (restore func()) {
	old := wsWriteDeadline.Swap(int64(d))
	return func() { wsWriteDeadline.Store(old) }
}

// UTF8Interceptors returns the gRPC interceptors that refuse invalid UTF-8
// in requests and clean status messages.
func UTF8Interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return utf8Unary, utf8Stream
}
