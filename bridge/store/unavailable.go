package store

import "errors"

// ErrUnavailable: the store's server could not be reached or ended the
// connection (a database restart or failover, a network cut). The call did
// not complete; whether a write took effect is known only for Commit,
// which then applied nothing. Retrying later is the remedy. Only a server
// backend (pgstore) returns it.
var ErrUnavailable = errors.New("store: unavailable")
