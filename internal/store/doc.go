// Package store is arbor's SQL layer: every statement the library runs is a
// named query here, rendered once for the configured schema (a validated
// identifier, never caller input), and every row comes back as a type of
// package arbortype.
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
