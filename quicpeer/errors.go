package quicpeer

import (
	"errors"
	"fmt"

	"github.com/pipestream/gateway/quicpeer/wire"
)

// CloseError is the session error after a CONNECTION_CLOSE that carried a
// PipeStream error code other than PIPESTREAM_NO_ERROR (Section 11.4).
// wire.CodeOf(err) returns its Code.
type CloseError struct {
	Code   wire.ErrorCode
	Remote bool // the peer closed the connection
	Reason string
}

func (e *CloseError) Error() string {
	who := "local"
	if e.Remote {
		who = "peer"
	}
	return fmt.Sprintf("quicpeer: connection closed by %s with %s: %s", who, e.Code, e.Reason)
}

// Unwrap exposes the code as a *wire.Error so wire.CodeOf and errors.As work.
func (e *CloseError) Unwrap() error { return &wire.Error{Code: e.Code, Msg: e.Reason} }

var (
	// ErrGoAway is returned (wrapped) by AssignID and SendEntity when the
	// peer sent GOAWAY and the entity ID lies above its Last Entity ID, or
	// when this endpoint itself is shutting down (Section 6.5). Dial a new
	// session for further entities.
	ErrGoAway = errors.New("quicpeer: session is going away; open a new session for new entities")
	// ErrCheckpointTimeout is returned by Checkpoint when the peer did not
	// acknowledge the checkpoint within its timeout (Section 9.3, 10.3).
	ErrCheckpointTimeout = errors.New("quicpeer: checkpoint not satisfied within its timeout")
	// ErrNotClient is returned by AssignID on a server session: the root
	// entity-ID space belongs to the client (docs/profile.md section 2).
	ErrNotClient = errors.New("quicpeer: only the client role assigns root entity IDs")
)

// localErr builds the error returned to a local caller for a rule the call
// would break; it carries the code a receiver would have used.
func localErr(code wire.ErrorCode, format string, args ...any) error {
	return wire.Errorf(code, format, args...)
}
