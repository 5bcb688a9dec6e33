package wire

// Tunables of the codec, one place, one rationale each.
const (
	// DefaultMaxEntityHeader caps the 4-octet entity Header Length
	// (Section 6.8.1) when the caller passes maxHeader <= 0: headers are a
	// few hundred octets; 64 KiB leaves room for large metadata maps.
	DefaultMaxEntityHeader = 64 << 10

	// MaxExtensionLength is the largest STATUS Extension Length ParseStatus
	// accepts (Section 6.6.1): the largest Yield extension (1 reason octet,
	// 3 length octets, a 16,777,215-octet token). Larger -> 0x06.
	MaxExtensionLength = 4 + 0xFFFFFF

	// controlReaderInitialBuf is the ControlReader's first buffer: a STATUS
	// frame with cursor plus a claim-check extension (40 octets) and most
	// CHECKPOINT bodies fit without growing.
	controlReaderInitialBuf = 512

	// controlReaderReadChunk is the most a ControlReader asks the
	// underlying reader for when it must grow, and the size of the scratch
	// used to discard unknown variable frames; growth follows bytes that
	// actually arrived, never a declared length.
	controlReaderReadChunk = 16 << 10

	// CBOR decode limits: the deepest message (PipeDoc -> ownership ->
	// scopes) nests 3 levels; metadata maps carry request headers.
	cborMaxNestedLevels  = 16
	cborMaxMapPairs      = 4096
	cborMaxArrayElements = 4096

	// headerBufSize is the pooled buffer entity headers are encoded into
	// and small ones read into: typical headers (ids, length, checksum,
	// content type, a few metadata pairs) are well under 1 KiB.
	headerBufSize = 1 << 10
	// headerBufMax: an encode buffer that grew beyond this (a header with
	// large metadata) is dropped instead of pooled.
	headerBufMax = 16 << 10

	// maxStreamReadChunk bounds the incremental reads of ReadEntityHeader.
	maxStreamReadChunk = 4 << 10
)
