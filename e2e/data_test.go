package e2e

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// Test inputs: deterministic, so a failure reproduces byte for byte.

// corpusLine is the repeating unit of textCorpus: 12 words, 2 sentences.
const corpusLine = "line %08d: the quick brown fox jumps. Over the lazy dog!\n"

// textCorpus returns about n bytes of text made of whole corpusLine lines.
func textCorpus(n int) []byte {
	line := len(fmt.Sprintf(corpusLine, 0))
	b := make([]byte, 0, n+line)
	for i := 0; len(b)+line <= n || len(b) == 0; i++ {
		b = fmt.Appendf(b, corpusLine, i)
	}
	return b
}

// binaryData returns n pseudo-random bytes from seed (no line structure,
// every byte value, so any re-encoding shows up as a mismatch).
func binaryData(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeTemp writes b to a file in t's temp dir and returns its path.
func writeTemp(t testing.TB, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// uniq returns a name unique within the run (request ids, display names).
func uniq(prefix string) string { return fmt.Sprintf("%s-%016x", prefix, rand.Uint64()) }
