package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// Leaf is one entity status in a scope (Section 9.5).
type Leaf struct {
	EntityID uint32
	Status   Status
}

// MerkleRoot returns the Merkle root of Section 9.5 (the draft's "9.4") over
// leaves: each leaf is the 5 octets entity-id (big-endian) || status (low 4
// bits), hashed with SHA-256; levels are built by SHA-256(left || right), an
// odd last node is promoted unhashed. Leaves are ordered by entity ID
// ascending (leaves is not modified; an unsorted slice is copied and
// sorted). Duplicate IDs are kept as given. The root of no leaves is 32 zero
// octets (the draft does not define it).
func MerkleRoot(leaves []Leaf) [32]byte {
	var root [32]byte
	if len(leaves) == 0 {
		return root
	}
	byID := func(a, b Leaf) int {
		switch {
		case a.EntityID < b.EntityID:
			return -1
		case a.EntityID > b.EntityID:
			return 1
		}
		return 0
	}
	if !slices.IsSortedFunc(leaves, byID) {
		leaves = slices.Clone(leaves)
		slices.SortStableFunc(leaves, byID)
	}
	level := make([][32]byte, len(leaves))
	var lb [5]byte
	for i, l := range leaves {
		binary.BigEndian.PutUint32(lb[:4], l.EntityID)
		lb[4] = byte(l.Status) & 0x0F
		level[i] = sha256.Sum256(lb[:])
	}
	var pair [64]byte
	for n := len(level); n > 1; {
		k := 0
		for i := 0; i+1 < n; i += 2 {
			copy(pair[:32], level[i][:])
			copy(pair[32:], level[i+1][:])
			level[k] = sha256.Sum256(pair[:])
			k++
		}
		if n%2 == 1 {
			level[k] = level[n-1]
			k++
		}
		n = k
	}
	return level[0]
}
