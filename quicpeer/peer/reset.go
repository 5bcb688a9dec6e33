package peer

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ResetKeyFileName is the peer's QUIC stateless reset key in its data dir:
// 32 random octets, created once (0600) and reused by every later start, so
// that a peer restarted on the same address resets the connections of its
// previous run at their next packet (RFC 9000 Section 10.3) instead of the
// gateway waiting for the idle timeout (docs/profile.md 8).
const ResetKeyFileName = "peer-reset.key"

// resetKeyLen is the size of a quic-go stateless reset key.
const resetKeyLen = 32

// loadOrCreateResetKey returns the key in <dataDir>/peer-reset.key,
// creating the file with a fresh random key when it does not exist. A file
// of another size is an error (delete it to regenerate). Whoever reads the
// key can end the peer's connections: it is written 0600 like the TLS key.
func loadOrCreateResetKey(o Options) (*[resetKeyLen]byte, error) {
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("peer: data dir: %w", err)
	}
	path := filepath.Join(o.DataDir, ResetKeyFileName)
	var key [resetKeyLen]byte
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != resetKeyLen {
			return nil, fmt.Errorf("peer: %s holds %d octets, want %d (delete it to generate a new stateless reset key)", path, len(b), resetKeyLen)
		}
		copy(key[:], b)
		return &key, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("peer: read stateless reset key: %w", err)
	}
	_, _ = rand.Read(key[:]) // crypto/rand.Read never fails (Go 1.24+)
	if err := writeFileAtomic(path, key[:], 0o600); err != nil {
		return nil, err
	}
	o.Logger.Info("generated the QUIC stateless reset key", "file", path)
	return &key, nil
}
