package gateway

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pipestream/gateway/bridge/store"
)

// TestStoreUnavailableStatus: a bridge error caused by an unreachable
// database (store.ErrUnavailable, a database restart) is UNAVAILABLE, which
// clients retry, not INTERNAL.
func TestStoreUnavailableStatus(t *testing.T) {
	err := fmt.Errorf("commit document: %w", fmt.Errorf("pgstore: commit: %w", store.ErrUnavailable))
	if st := toStatus(err); status.Code(st) != codes.Unavailable {
		t.Fatalf("toStatus(%v) = %v, want Unavailable", err, st)
	}
}
