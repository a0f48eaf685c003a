// Package arborui is arbor's web view: the conversations with live work and
// the recent ones, a conversation's task tree that updates as it changes,
// and a task's whole record; and, only when enabled, the operator's
// actions (abort, cancel, wake, emit).
//
// NewHandler returns an http.Handler to mount in your own server, under any
// prefix; `arbor ui` serves it on its own. Pages are rendered on the server
// with html/template, so everything they show — task input, results and
// errors are user and model data — is escaped in one place; a small
// embedded script swaps in the fragments that server-sent events push
// (fed by the engine's Follow, which shares one LISTEN per Engine). The
// assets are embedded: nothing comes from a CDN and nothing is built at
// install time.
//
// It reads through tasks.Engine only and writes only through the actions,
// which are refused unless Options.Actions is set, and then only for a POST
// that carries the handler's token and comes from the same origin. It
// imports nothing but the standard library and arbor's public packages.
package arborui
