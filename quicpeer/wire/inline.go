package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
)

// Inline results (docs/profile.md 4.3.2): a negotiated extension of the
// COMPLETE status (draft-02 Section 6.6.1 lets a status carry "a
// negotiated extension"; a receiver that did not negotiate it skips the
// data by its Extension Length). The extension data is exactly what the
// result's entity stream would carry (Section 6.8.1): the 4-octet Header
// Length, the result's EntityHeader in the negotiated format, then the
// payload. So the result is one frame on stream 0 instead of a stream of
// its own, with the same header, checksum and metadata.

// AppendInlineResultExt appends the inline-result extension data for the
// result header h and its payload to b, for use as StatusFrame.Ext of a
// COMPLETE. h must describe payload: PayloadLength its length and
// Checksum its SHA-256 (required: the receiver refuses an inline result
// without one). h is validated as WriteEntityHeader does.
func AppendInlineResultExt(b []byte, c Codec, h *EntityHeader, payload []byte) ([]byte, error) {
	if h.PayloadLength != uint64(len(payload)) {
		return b, Errorf(CodeEntityInvalid, "inline result of entity %d: payload is %d octets, payload-length says %d", h.EntityID, len(payload), h.PayloadLength)
	}
	if len(h.Checksum) != sha256.Size {
		return b, Errorf(CodeEntityInvalid, "inline result of entity %d: a checksum (SHA-256) is required", h.EntityID)
	}
	b, err := AppendEntityHeader(b, c, h)
	if err != nil {
		return b, err
	}
	return append(b, payload...), nil
}

// InlineResult decodes and verifies the inline result a COMPLETE status
// carries (AppendInlineResultExt). maxExt is the most extension octets
// the receiver offered: a longer extension, or one the ControlReader
// skipped unread (ExtSkipped), is *Error 0x06. Every other defect is a
// *Error of the result, as the same bytes on an entity stream would be:
// a Header Length of 0 or beyond the extension, an undecodable header, an
// entity-id other than the status's, no checksum, a payload whose length
// differs from payload-length (0x05), or whose SHA-256 differs from the
// checksum (0x04). The payload aliases f.Ext.
func (f *StatusFrame) InlineResult(c Codec, maxExt int) (*EntityHeader, []byte, error) {
	switch {
	case f.Status != StatusComplete || !f.HasExt:
		return nil, nil, Errorf(CodeEntityInvalid, "STATUS %s (E=%t) carries no inline result", f.Status, f.HasExt)
	case f.ExtSkipped > 0:
		return nil, nil, Errorf(CodeEntityTooLarge, "inline result of entity %d: extension of %d octets exceeds the %d offered (skipped unread)", f.EntityID, f.ExtSkipped, maxExt)
	case len(f.Ext) > maxExt:
		return nil, nil, Errorf(CodeEntityTooLarge, "inline result of entity %d: extension of %d octets exceeds the %d offered", f.EntityID, len(f.Ext), maxExt)
	case len(f.Ext) < EntityHeaderLenLen:
		return nil, nil, Errorf(CodeEntityInvalid, "inline result of entity %d: extension of %d octets has no Header Length", f.EntityID, len(f.Ext))
	}
	hl := binary.BigEndian.Uint32(f.Ext)
	rest := f.Ext[EntityHeaderLenLen:]
	if hl == 0 || uint64(hl) > uint64(len(rest)) {
		return nil, nil, Errorf(CodeEntityInvalid, "inline result of entity %d: Header Length %d does not fit the %d octets after it", f.EntityID, hl, len(rest))
	}
	h, err := c.UnmarshalEntityHeader(rest[:hl])
	if err != nil {
		return nil, nil, err
	}
	payload := rest[hl:]
	switch {
	case h.EntityID != f.EntityID:
		return nil, nil, Errorf(CodeEntityInvalid, "inline result: header entity-id %d differs from the status's %d", h.EntityID, f.EntityID)
	case len(h.Checksum) != sha256.Size:
		return nil, nil, Errorf(CodeEntityInvalid, "inline result of entity %d: no checksum", f.EntityID)
	case h.PayloadLength != uint64(len(payload)):
		return nil, nil, Errorf(CodeEntityInvalid, "inline result of entity %d: payload is %d octets, payload-length says %d", f.EntityID, len(payload), h.PayloadLength)
	}
	if sum := sha256.Sum256(payload); !bytes.Equal(sum[:], h.Checksum) {
		return nil, nil, Errorf(CodeIntegrityError, "inline result of entity %d: payload SHA-256 %x does not match the header checksum %x", f.EntityID, sum, h.Checksum)
	}
	return h, payload, nil
}
