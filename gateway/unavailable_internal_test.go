package gateway

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// TestStoreUnavailableLeaksNothing: the driver's real connection error
// names the database's user, name, host and port; what the client gets is
// UNAVAILABLE with reason STORE_UNAVAILABLE and none of them, whether the
// store classified the error (store.ErrUnavailable) or not.
func TestStoreUnavailableLeaksNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close() // nothing listens there now: the connect is refused
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dsn := fmt.Sprintf("postgres://secretuser:secretpw@127.0.0.1:%d/secretdb?connect_timeout=5", addr.Port)
	_, cerr := pgx.Connect(ctx, dsn)
	if cerr == nil || !strings.Contains(cerr.Error(), "secretuser") {
		t.Fatalf("the driver's error %v does not name the user; the test would prove nothing", cerr)
	}
	for _, err := range []error{
		fmt.Errorf("get document: %w", fmt.Errorf("pgstore: get document: %w (%v)", store.ErrUnavailable, cerr)),
		fmt.Errorf("pgstore: event stats: %w", cerr),
	} {
		st := status.Convert(toStatus(err))
		if st.Code() != codes.Unavailable || errorReason(st.Err()) != ReasonStoreUnavailable {
			t.Fatalf("toStatus(%v) = %v %q, want UNAVAILABLE with reason %s", err, st.Code(), errorReason(st.Err()), ReasonStoreUnavailable)
		}
		for _, secret := range []string{"secretuser", "secretpw", "secretdb", "127.0.0.1", strconv.Itoa(addr.Port)} {
			if strings.Contains(st.Message(), secret) {
				t.Fatalf("message %q names %q", st.Message(), secret)
			}
		}
	}
}
