package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/pipestream/gateway/bridge/store/pgstore"
	"github.com/pipestream/gateway/bridge/store/storetest"
	"github.com/pipestream/gateway/internal/pgtest"
)

// TestConformance runs the backend-neutral suite on PostgreSQL: each test
// gets a fresh database on the pgtest cluster.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Backend{
		NewState: func(t *testing.T) string { return pgtest.NewDatabase(t) },
		Open: func(t *testing.T, dsn string) storetest.Store {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, err := pgstore.Open(ctx, dsn, pgstore.Options{MaxConns: 8})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			return s
		},
	})
}
