// Package machine runs arbor inside a process: the per-conversation
// machines and the node runner (DESIGN §3.8), and the wake-up service of
// DESIGN §3.7, [Waker], which starts the River client that works the wake
// queue and keeps local timers so that sleeps end on time.
//
// A machine decides nothing itself about tasks: every change goes through
// package tasks, in the engine's transactions and locking order, and every
// wake, whether it comes from River, from a timer or from two nodes at
// once, goes through the engine's one idempotent path
// ([tasks.Engine.WakeSleeping]). Process memory here is a cache: a timer
// lost with its process costs latency, never a wake, because River's job
// for the sleep is in the database.
package machine
