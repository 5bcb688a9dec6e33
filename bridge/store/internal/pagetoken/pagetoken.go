// Package pagetoken is the one page-token format of ListDocuments, shared
// by the backends (bridge/store/sqlite, bridge/store/pgstore): a token
// issued by one backend decodes in the other, and both answer the same
// store.ErrBadPageToken for a token they did not issue.
//
// Format: base64url(version | state (1 byte) | create_time (8 bytes BE) |
// id), the keyset of the last document of the previous page.
package pagetoken

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"unicode/utf8"

	"github.com/pipestream/gateway/bridge/store"
	gatewayv1 "github.com/pipestream/gateway/gen/pipestream/gateway/v1"
)

// version is the format's first octet.
const version = 1

// header is the octets before the id: version, state, create_time.
const header = 10

// Encode returns the token of the page after the document (createTime,
// id) under the state filter state.
func Encode(state gatewayv1.State, createTime int64, id string) string {
	b := make([]byte, 0, header+len(id))
	b = append(b, version, byte(state))
	b = binary.BigEndian.AppendUint64(b, uint64(createTime))
	b = append(b, id...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Decode returns the keyset of tok, which must have been issued for the
// same state filter and name an id of at most maxIDLen octets; else an
// error wrapping store.ErrBadPageToken that says what to do.
func Decode(tok string, state gatewayv1.State, maxIDLen int) (createTime int64, id string, err error) {
	if len(tok) > base64.RawURLEncoding.EncodedLen(header+maxIDLen) {
		return 0, "", fmt.Errorf("%w: too long", store.ErrBadPageToken)
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, "", fmt.Errorf("%w: not base64url", store.ErrBadPageToken)
	}
	if len(b) < header+1 || b[0] != version {
		return 0, "", fmt.Errorf("%w: malformed; pass next_page_token back unchanged", store.ErrBadPageToken)
	}
	if b[1] != byte(state) {
		return 0, "", fmt.Errorf("%w: issued for another state filter; restart paging without a token", store.ErrBadPageToken)
	}
	id = string(b[header:])
	if !utf8.ValidString(id) {
		return 0, "", fmt.Errorf("%w: malformed", store.ErrBadPageToken)
	}
	return int64(binary.BigEndian.Uint64(b[2:header])), id, nil
}
