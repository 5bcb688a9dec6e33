package sqlite_test

import (
	"context"
	"testing"

	"github.com/pipestream/gateway/bridge/store/sqlite"
	"github.com/pipestream/gateway/bridge/store/storetest"
)

// TestConformance runs the backend-neutral suite on the SQLite backend: a
// state is a data directory.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Backend{
		NewState: func(t *testing.T) string { return t.TempDir() },
		Open: func(t *testing.T, dir string) storetest.Store {
			s, err := sqlite.Open(context.Background(), dir, sqlite.Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		},
	})
}
