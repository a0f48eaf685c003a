// Package store is arbor's only door to PostgreSQL: every SQL statement the
// library runs is a named query here, rendered once for the configured schema
// (a validated identifier, never caller input), and every row comes back as a
// typed value.
//
// The store does not decide anything. It does not validate transitions or
// open transactions: the engine (package tasks) asks package fsm, opens the
// transaction and calls these functions on it in the order of DESIGN §5
// (conversation row first, then tasks ancestor-first, then by ascending id).
// Functions named Lock… take row locks (FOR NO KEY UPDATE, which does not
// block foreign-key checks of inserts) that last until the caller's
// transaction ends.
package store
