// Package arborhttp is the glue between arbor and a chat backend's HTTP
// handlers, on the standard library only: Stream serves a conversation's
// log as server-sent events (resumed from Last-Event-ID, with heartbeats,
// ended by the client or by a turn's settle), and Status turns an arbor
// error into an HTTP status and a short message a client may read.
package arborhttp
