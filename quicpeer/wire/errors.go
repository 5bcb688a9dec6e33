package wire

import (
	"errors"
	"fmt"
)

// ErrorCode is a PipeStream error code (Section 11.4), used as the QUIC
// application error code on CONNECTION_CLOSE and RESET_STREAM.
type ErrorCode uint64

const (
	CodeNoError          ErrorCode = 0x00
	CodeInternalError    ErrorCode = 0x01
	CodeIdleTimeout      ErrorCode = 0x02
	CodeControlReset     ErrorCode = 0x03
	CodeIntegrityError   ErrorCode = 0x04
	CodeEntityInvalid    ErrorCode = 0x05
	CodeEntityTooLarge   ErrorCode = 0x06
	CodeDepthExceeded    ErrorCode = 0x07
	CodeWindowExceeded   ErrorCode = 0x08
	CodeScopeInvalid     ErrorCode = 0x09
	CodeClaimExpired     ErrorCode = 0x0A
	CodeClaimNotFound    ErrorCode = 0x0B
	CodeLayerUnsupported ErrorCode = 0x0C
	// CodeFrameError is draft-04's PIPESTREAM_FRAME_ERROR: a control
	// frame whose Length disagrees with its layout. Draft-02 has no such
	// code; only a connection using draft-04 framing sends it (framing.go).
	CodeFrameError ErrorCode = 0x0D
)

var codeNames = [...]string{"PIPESTREAM_NO_ERROR", "PIPESTREAM_INTERNAL_ERROR", "PIPESTREAM_IDLE_TIMEOUT",
	"PIPESTREAM_CONTROL_RESET", "PIPESTREAM_INTEGRITY_ERROR", "PIPESTREAM_ENTITY_INVALID",
	"PIPESTREAM_ENTITY_TOO_LARGE", "PIPESTREAM_DEPTH_EXCEEDED", "PIPESTREAM_WINDOW_EXCEEDED",
	"PIPESTREAM_SCOPE_INVALID", "PIPESTREAM_CLAIM_EXPIRED", "PIPESTREAM_CLAIM_NOT_FOUND",
	"PIPESTREAM_LAYER_UNSUPPORTED", "PIPESTREAM_FRAME_ERROR"}

func (c ErrorCode) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("PIPESTREAM_ERROR(0x%02X)", uint64(c))
}

// Error is a protocol error carrying the draft's wire code. It is the only
// error type wire decoders return (besides ErrShort for incomplete input).
type Error struct {
	Code ErrorCode
	Msg  string
}

func (e *Error) Error() string { return e.Code.String() + ": " + e.Msg }

// Errorf builds a *Error.
func Errorf(code ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// ErrShort is returned by byte-slice parsers when the input is a proper
// prefix of a frame: more bytes are needed. Stream readers turn an EOF in
// the middle of a frame into a *Error instead.
var ErrShort = errors.New("pipestream: short frame, need more bytes")

// CodeOf returns the wire code of err: the code of a wrapped *Error, or
// CodeInternalError for anything else (CodeNoError for nil).
func CodeOf(err error) ErrorCode {
	if err == nil {
		return CodeNoError
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return CodeInternalError
}
