package bridge

import "github.com/pipestream/gateway/bridge/store"

// Store is what the bridge needs of the durable store. The interface and
// its contract live in the backend-neutral package (store.Store); the
// SQLite backend (bridge/store/sqlite, the default, opened in
// Options.DataDir) implements it, and Options.Store plugs in another
// (bridge/store/pgstore), which runs the suite in bridge/store/storetest.
//
// The Store holds durable state only. Scratch bytes of a running attempt
// (the chunk results of a plain peer, plain.go) stay in files under
// Options.DataDir: they are never needed after the attempt, and an attempt
// that is cut short (a restart, another process taking the document over)
// is dispatched again and receives them anew.
type Store = store.Store
