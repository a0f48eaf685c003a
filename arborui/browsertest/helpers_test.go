package browsertest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
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
	pool   *pgxpool.Pool
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
	return &view{ctx: context.Background(), pool: pool, engine: engine, srv: srv, schema: schema, base: srv.URL + prefix}
}

// text evaluates a JavaScript expression of type string in the tab.
func text(t *testing.T, b context.Context, expr string) string {
	t.Helper()
	s, err := chromedp.Run(b, chromedp.Evaluate[string](expr))
	require.NoError(t, err, expr)
	return s
}

// submit clicks sel, a form's button or a link, and returns once the
// page it led to has loaded: a mark set on the page before the click is
// gone (a live fragment may change the old page meanwhile, so its content
// alone cannot tell), and the new document is parsed.
func submit(t *testing.T, b context.Context, sel string) {
	t.Helper()
	require.Equal(t, "marked", text(t, b, `(() => { const m = document.createElement("i"); m.id = "arbor-stale"; document.body.append(m); return "marked"; })()`))
	require.NoError(t, chromedp.Do(b, clickLive(sel), chromedp.WaitNotPresent(`#arbor-stale`), chromedp.WaitReady(`body`)), "submit %s", sel)
	// The whole document parsed, not only its beginning.
	_, err := chromedp.Run(b, chromedp.Poll[bool](`document.readyState !== "loading"`, chromedp.WithPollingTimeout(0)))
	require.NoError(t, err, "submit %s: the page loads", sel)
}

// domSize is the tab's document: how many elements it has, and the
// length of its HTML.
func domSize(t *testing.T, b context.Context) (elements, htmlBytes int) {
	t.Helper()
	n, err := chromedp.Run(b, chromedp.Evaluate[[]int](`[document.getElementsByTagName("*").length, document.documentElement.outerHTML.length]`))
	require.NoError(t, err)
	return n[0], n[1]
}

// exec runs SQL on the view's schema ({schema} in it is replaced).
func (v *view) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := v.pool.Exec(v.ctx, strings.ReplaceAll(sql, "{schema}", v.schema), args...)
	require.NoError(t, err)
}

// fixedTrace is a trace injector that gives every task it.
type fixedTrace map[string]string

func (f fixedTrace) InjectTrace(context.Context) map[string]string { return f }

// until waits for the JavaScript expression to be true in the tab, on
// every change of its DOM (bounded by the tab's context only).
func until(t *testing.T, b context.Context, expr string) {
	t.Helper()
	_, err := chromedp.Run(b, chromedp.Poll[bool](expr, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(0)))
	require.NoError(t, err, "until %s", expr)
}

// clickLive waits for sel to be visible and clicks it by script, in one
// turn of the page's event loop. chromedp.Click finds the node and then
// sends it a click in two steps: a live update of the page that replaces
// the element between them fails the click ("Could not find node with
// given id"), although a user's click would have landed on the new one.
func clickLive(sel string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		var v chromedp.Void
		if _, err := chromedp.WaitVisible(sel)(ctx, tg); err != nil {
			return v, err
		}
		clicked, err := chromedp.Evaluate[bool](fmt.Sprintf(
			`(() => { const e = document.querySelector(%s); if (!e) return false; e.click(); return true; })()`, strconv.Quote(sel)))(ctx, tg)
		if err != nil {
			return v, err
		}
		if !clicked {
			return v, fmt.Errorf("click %s: no such element", sel)
		}
		return v, nil
	}
}
