// Package arborhttp is the glue between arbor and a chat backend's HTTP
// handlers, on the standard library only: Status turns an arbor error into
// an HTTP status and a short message a client may read.
package arborhttp
