// Package store is arbor's SQL layer: every statement the library runs is a
// named query of the public package store's SQL (store/queries/*.sql), read
// here by name once at start-up and rendered once for the configured schema
// (a validated identifier, never caller input); every row comes back as a
// type of package arbortype. Each file of this package wraps the
// statements of its concept (claim.go runs those of claim.sql).
//
// It is internal: user code reaches it only through package tasks (your
// application's operations) and package machine (running handlers), and no
// public arbor package names one of its types in a signature. What a user's
// own code meets of the schema (the River job kinds) is in the public
// package store.
//
// The store decides nothing. It does not validate transitions or open
// transactions: the engine (internal/core) asks package fsm, opens the
// transaction and calls these functions on it in the locking order of
// docs/design.md §5 (conversation rows first, then tasks ancestor-first,
// then by ascending id). Functions named Lock… take row locks (FOR NO KEY
// UPDATE, which does not block foreign-key checks of inserts) that last
// until the caller's transaction ends.
package store
