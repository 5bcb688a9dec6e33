package eventlog

import "github.com/pipestream/gateway/bridge/store"

// Store is what the event log needs of the durable store. The interface
// and its contract (the event seq rules, Commit's guarantees, the hook)
// live in the backend-neutral package: store.EventStore.
type Store = store.EventStore
