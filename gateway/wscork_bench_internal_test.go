package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// BenchmarkWSBatchWrite compares the two ways a subscriber's batch of
// event frames can reach its socket, per batch of 9 frames (the batch
// size the fan-out bench sees at 1,000 subscribers) of a 180-byte event
// message, over a real TCP connection whose client reads and discards:
// "coder" writes each frame with coder/websocket's Conn.Write into the
// corked connection (the code before issue 25's second round), "own"
// appends the pre-framed message (corkConn.writeData). Both flush the
// batch with one write.
//
//	go test -run '^$' -bench WSBatchWrite -count 6 ./gateway/
func BenchmarkWSBatchWrite(b *testing.B) {
	payload := []byte(strings.Repeat("e", 180))
	msg := wsBinaryMessage(nil, payload)
	for _, mode := range []string{"coder", "own"} {
		b.Run(mode, func(b *testing.B) {
			done := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer close(done)
				hj := &corkHijacker{ResponseWriter: w}
				c, err := websocket.Accept(hj, r, nil)
				if err != nil {
					b.Error(err)
					return
				}
				defer c.CloseNow()
				cc := hj.conn
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					cc.cork()
					for range 9 {
						var err error
						if mode == "coder" {
							err = c.Write(context.Background(), websocket.MessageBinary, payload)
						} else {
							err = cc.writeData(msg)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
					if err := cc.flush(); err != nil {
						b.Error(err)
						return
					}
				}
				b.StopTimer()
			}))
			defer srv.Close()
			ctx := context.Background()
			c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.CloseNow()
			go func() {
				for {
					_, r, err := c.Reader(ctx)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, r)
				}
			}()
			<-done
		})
	}
}
