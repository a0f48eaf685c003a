// Package browsertest drives arbor's web view (package arborui) in a real
// headless Chromium, against a real PostgreSQL: the page loads and shows a
// running conversation's tree, a change appears without a reload, and an
// abort button aborts. It is a module of its own so that the browser
// driver (chromedp) is not a dependency of arbor's. Run it with
// `make browser`, which installs Chromium from Debian's packages if it is
// missing.
package browsertest
