package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pipestream/gateway/bridge/store"
)

// unavailable reports whether err means the server could not be reached
// or ended the session: a connection that failed or broke, SQLSTATE class
// 08 (connection exception), 57P01..57P03 (admin shutdown, crash
// shutdown, cannot connect now: a restart), or a network error. Those
// become store.ErrUnavailable (mapErr, Commit). The caller's context
// ending is not: it stays ctx.Err().
func unavailable(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	switch code := sqlState(err); {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false // the caller's context ended (it satisfies net.Error)
	case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03":
		return true
	case code != "":
		return false
	case errors.As(err, &ce), errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	return strings.Contains(err.Error(), "conn closed") || strings.Contains(err.Error(), "connection reset")
}

// asUnavailable wraps err with store.ErrUnavailable when it means the
// server is out of reach and it does not say so yet (Commit's errors).
func asUnavailable(err error) error {
	if err == nil || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrClosed) || !unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}
