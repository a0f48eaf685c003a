// Package arborui is arbor's web view, what an operator of a chat backend
// keeps open: every conversation, a page at a time, filtered and searched,
// a failed turn, a queued turn and stuck work each flagged; a
// conversation's task tree (paged when large) beside its log; a task's
// whole record — attempts and their errors, durations and a timeline,
// checkpoint, events, children, budgets, trace, log; the approvals every
// conversation awaits, with their context, and the turns parked on a
// budget; the turns per minute and the pending work per tenant; the nodes
// and what they hold; the concurrency limits, with their runs, and the
// tenants' weights. Every page is live. And, only when enabled, the
// operator's actions (abort, cancel, wake, emit, approve or deny, raise a
// budget, abort or cancel the conversations selected).
//
// NewHandler returns an http.Handler to mount in your own server, under any
// prefix; `arbor ui` serves it on its own. Pages are rendered on the server
// with html/template, so everything they show — task input, results and
// errors are user and model data — is escaped in one place, and scrubbed
// of control characters after it; a small embedded script swaps in the
// fragments that server-sent events push (fed by the engine's Follow, one
// per conversation shown, which shares one LISTEN per Engine). Every read
// is bounded and pages by keyset, so a page costs the same over 100,000
// conversations, or in a tree of 100,000 tasks, as over ten. The assets
// are embedded: nothing comes from a CDN and nothing is built at install
// time.
//
// It reads through tasks.Engine only and writes only through the actions,
// which are refused unless Options.Actions is set, and then only for a POST
// that names a host the handler serves, carries its token and comes from
// its own origin. It imports nothing but the standard library and arbor's
// public packages. It authenticates nobody: mount it behind your own login.
package arborui
