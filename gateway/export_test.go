package gateway

import "time"

// SetWebSocketWriteTimeout shortens the per-frame WebSocket write deadline
// (wsWriteTimeout) for a test and returns the function that restores it.
func SetWebSocketWriteTimeout(d time.Duration) (restore func()) {
	old := wsWriteDeadline.Swap(int64(d))
	return func() { wsWriteDeadline.Store(old) }
}
