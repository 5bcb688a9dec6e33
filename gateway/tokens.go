package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/pipestream/gateway/bridge"
)

// tokenHashPrefix names the hash of a token file entry; the only one
// accepted today.
const tokenHashPrefix = "sha256:"

// HashToken returns the token file form of a bearer token's hash,
// "sha256:<64 hex digits>". Operators store this, never the token itself
// (`gateway hash-token`).
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return tokenHashPrefix + hex.EncodeToString(sum[:])
}

// tokenEntry is one line of a token file.
type tokenEntry struct {
	hash   [sha256.Size]byte
	tenant bridge.Tenant
}

// ParseTokenFile parses the token file format:
//
//	# comment
//	sha256:<hex of SHA-256(token)> <tenant>
//
// one entry per line, blank lines and lines starting with # ignored,
// fields separated by spaces or tabs, a trailing "# comment" allowed.
// Tenants are 1..128 characters of [A-Za-z0-9._@-]. A hash may appear once.
// Errors name the line and what to fix.
func ParseTokenFile(b []byte) (map[[sha256.Size]byte]bridge.Tenant, error) {
	out := map[[sha256.Size]byte]bridge.Tenant{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: want \"sha256:<hex> <tenant>\", got %d fields", n, len(fields))
		}
		hx, ok := strings.CutPrefix(fields[0], tokenHashPrefix)
		if !ok {
			return nil, fmt.Errorf("line %d: the hash must start with %q (raw tokens are not accepted: run `gateway hash-token`)", n, tokenHashPrefix)
		}
		var h [sha256.Size]byte
		if len(hx) != 2*sha256.Size {
			return nil, fmt.Errorf("line %d: the SHA-256 hash must be %d hex digits, got %d", n, 2*sha256.Size, len(hx))
		}
		if _, err := hex.Decode(h[:], []byte(hx)); err != nil {
			return nil, fmt.Errorf("line %d: the hash is not hex: %v", n, err)
		}
		if err := validTenant(fields[1]); err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		if prev, dup := out[h]; dup {
			return nil, fmt.Errorf("line %d: this token hash is already mapped to tenant %q; a token maps to exactly one tenant", n, prev)
		}
		out[h] = bridge.Tenant(fields[1])
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read: %w (lines are limited to 64 KiB)", err)
	}
	return out, nil
}

func validTenant(t string) error {
	if len(t) == 0 || len(t) > 128 {
		return fmt.Errorf("tenant %q must be 1 to 128 characters", t)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '@') {
			return fmt.Errorf("tenant %q: only letters, digits and . _ - @ are allowed", t)
		}
	}
	return nil
}

// TokenFile is an Authenticator over a file of token hashes (see
// ParseTokenFile). The presented token is hashed with SHA-256 and compared
// in constant time with every entry, so neither the raw tokens nor the
// timing of a lookup reveal anything. Reload swaps the set atomically; a
// file that fails to parse keeps the previous set.
type TokenFile struct {
	path string
	log  *slog.Logger

	mu      sync.Mutex // serializes Reload
	modTime time.Time
	size    int64
	set     atomic.Pointer[[]tokenEntry]
}

// LoadTokenFile reads and parses path; log receives reload messages (nil:
// slog.Default()).
func LoadTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	if log == nil {
		log = slog.Default()
	}
	f := &TokenFile{path: path, log: log}
	if err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// Len is the number of tokens currently accepted.
func (f *TokenFile) Len() int { return len(*f.set.Load()) }

func (f *TokenFile) load() error {
	fi, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	if len(b) == 0 {
		// A file being rewritten in place (truncate, then write) is empty
		// for a moment; taking that as "no tokens" would lock every client
		// out. To revoke every token, leave a comment line in the file.
		return fmt.Errorf("token file %s is empty (still being written?); write at least a comment line to accept no tokens", f.path)
	}
	m, err := ParseTokenFile(b)
	if err != nil {
		return fmt.Errorf("token file %s: %w", f.path, err)
	}
	set := make([]tokenEntry, 0, len(m))
	for h, t := range m {
		set = append(set, tokenEntry{hash: h, tenant: t})
	}
	f.set.Store(&set)
	f.modTime, f.size = fi.ModTime(), fi.Size()
	return nil
}

// Reload re-reads the file. On error the previous set stays in force and
// the error is logged and returned.
func (f *TokenFile) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.load(); err != nil {
		f.log.Error("token file reload failed; keeping the previous tokens", "path", f.path, "error", err)
		return err
	}
	f.log.Info("token file reloaded", "path", f.path, "tokens", f.Len())
	return nil
}

// changed reports whether the file's mtime or size differ from the last
// successful or attempted load.
func (f *TokenFile) changed() bool {
	fi, err := os.Stat(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		return false // a missing file keeps the current set; the next good write reloads
	}
	if fi.ModTime().Equal(f.modTime) && fi.Size() == f.size {
		return false
	}
	// Remember what we looked at so that a bad file is reported once, not
	// every interval.
	f.modTime, f.size = fi.ModTime(), fi.Size()
	return true
}

// Watch polls the file every interval and reloads it when its modification
// time or size changes, until ctx ends. Operators can also trigger Reload
// (the binary does on SIGHUP).
func (f *TokenFile) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if f.changed() {
				_ = f.Reload()
			}
		}
	}
}

// Authenticate implements Authenticator.
func (f *TokenFile) Authenticate(_ context.Context, token string) (bridge.Tenant, error) {
	if token == "" {
		return "", errMissingToken
	}
	sum := sha256.Sum256([]byte(token))
	var tenant bridge.Tenant
	found := 0
	for _, e := range *f.set.Load() {
		// Every entry is compared: the time taken does not depend on
		// where (or whether) the token matches.
		eq := subtle.ConstantTimeCompare(sum[:], e.hash[:])
		if eq == 1 {
			tenant = e.tenant
		}
		found |= eq
	}
	if found == 0 {
		return "", errUnknownToken
	}
	return tenant, nil
}

// ErrorInfo reasons of authentication failures.
const (
	ReasonMissingCredentials = "MISSING_CREDENTIALS"
	ReasonInvalidToken       = "INVALID_TOKEN"
)

var (
	errMissingToken = statusError(codes.Unauthenticated, ReasonMissingCredentials, `missing credentials: send "authorization: Bearer <token>" (REST: the Authorization header)`)
	errUnknownToken = statusError(codes.Unauthenticated, ReasonInvalidToken, "unknown bearer token: check the token you were issued (tokens are case-sensitive)")
)

// errNoTokens is returned by LoadTokenFile callers that want at least one.
var errNoTokens = errors.New("token file has no entries: add lines from `gateway hash-token`")

// RequireTokens returns an error when the file accepts no token at all.
func (f *TokenFile) RequireTokens() error {
	if f.Len() == 0 {
		return fmt.Errorf("%s: %w", f.path, errNoTokens)
	}
	return nil
}
