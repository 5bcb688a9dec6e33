package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pipestream/gateway/bridge/store"
)

// Which errors mean "the database is out of reach" (store.ErrUnavailable)
// and which do not: a caller's ended context stays its own error.
func TestUnavailableClassification(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true}, // admin shutdown
		{&pgconn.PgError{Code: "57P03"}, true}, // cannot connect now (starting up, shutting down)
		{&pgconn.PgError{Code: "08006"}, true}, // connection failure
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{&pgconn.PgError{Code: "23505"}, false}, // unique violation
		{&pgconn.PgError{Code: "53100"}, false}, // disk full: ENOSPC instead
		{context.DeadlineExceeded, false},
		{fmt.Errorf("commit: %w", context.Canceled), false},
		{errors.New("pgstore: some other failure"), false},
	}
	for _, c := range cases {
		if got := errors.Is(asUnavailable(c.err), store.ErrUnavailable); got != c.want {
			t.Errorf("%v: unavailable %v, want %v", c.err, got, c.want)
		}
	}
}
