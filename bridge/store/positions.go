package store

// RetentionPositions is what one event log publishes to the others sharing
// its store (docs/scale-out.md, Retention across replicas): the lowest
// position of the clients that count for its retention (RRDP delta
// retention draft, min_serial) and how many counted. Min is meaningless
// when Clients is 0.
type RetentionPositions struct {
	Min     uint64
	Clients int
}
