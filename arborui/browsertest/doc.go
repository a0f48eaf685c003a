// Package browsertest drives arbor's web view (package arborui) in a real
// headless Chromium, against a real PostgreSQL: every view and action —
// the list of 100,000 conversations and a tree of 100,000 tasks (paged,
// their DOM bounded), the task's page, the log's stream, the approvals,
// the nodes, abort and answer — and the view's defences: hostile strings
// in every field, hostile conversation ids, DNS rebinding (Chromium's host
// resolver maps evil.example to the view), open redirects, control
// characters. It is a module of its own so that the browser driver
// (chromedp) is not a dependency of arbor's. Run it with `make browser`,
// which installs Chromium from Debian's packages if it is missing.
package browsertest
