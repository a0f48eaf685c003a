package browsertest

import (
	"context"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// browser starts a headless Chromium (Debian's; make browser installs it)
// and returns a context that drives one tab of it. extra are more of
// Chromium's flags.
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	require.NotEmpty(t, path, "no Chromium on PATH: run `make browser`, which installs Debian's chromium package")
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	// The first action starts the browser, on the tab's own context (a
	// timeout there would stop the browser).
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start Chromium at %s", path)
	// The steps are bounded on a busy machine; each waits on the page's
	// state, never on a clock.
	ctx, cancelTime := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTime)
	return ctx
}

// view is a handler on a schema of the test's own, served under /arbor,
// with an engine that can drive tasks by hand (enginetest).
type view struct {
	ctx    context.Context
	engine *enginetest.Engine
	srv    *httptest.Server
	schema string
	// base is the handler's root: srv.URL + its prefix.
	base string
}

func newView(t *testing.T, opts *arborui.Options) *view {
	t.Helper()
	return newViewAt(t, "/arbor", opts)
}

// newViewAt is newView with the handler at prefix.
func newViewAt(t *testing.T, prefix string, opts *arborui.Options) *view {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	engine := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	if opts == nil {
		opts = &arborui.Options{}
	}
	opts.Prefix = prefix
	h, err := arborui.NewHandler(engine.Engine, opts)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &view{ctx: context.Background(), engine: engine, srv: srv, schema: schema, base: srv.URL + prefix}
}

// text evaluates a JavaScript expression of type string in the tab.
func text(t *testing.T, b context.Context, expr string) string {
	t.Helper()
	s, err := chromedp.Run(b, chromedp.Evaluate[string](expr))
	require.NoError(t, err, expr)
	return s
}

// submit clicks sel, a form's button, and returns once the page the form
// led to has loaded: a mark set on the page before the click is gone (a
// live fragment may change the old page meanwhile, so its content alone
// cannot tell).
func submit(t *testing.T, b context.Context, sel string) {
	t.Helper()
	require.Equal(t, "marked", text(t, b, `(() => { const m = document.createElement("i"); m.id = "arbor-stale"; document.body.append(m); return "marked"; })()`))
	require.NoError(t, chromedp.Do(b, chromedp.Click(sel), chromedp.WaitNotPresent(`#arbor-stale`), chromedp.WaitReady(`body`)), "submit %s", sel)
}
