package browsertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/arborui"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// gates hold each tool's run until the test releases it: the test decides
// when a task of the tree changes, and waits for the browser to show it.
type gates struct {
	mu sync.Mutex
	m  map[string]chan error
}

func (g *gates) of(kind string) chan error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m[kind] == nil {
		g.m[kind] = make(chan error, 1)
	}
	return g.m[kind]
}

// release ends kind's run: completed with a result when err is nil,
// failed with err otherwise.
func (g *gates) release(kind string, err error) { g.of(kind) <- err }

// handlers are a demo-like turn: it fans out to tool calls and a
// sub-agent that browses, and waits for all of them; each tool runs until
// the test releases it (or its run is aborted).
func (g *gates) handlers() map[string]machine.Handler {
	tool := func(ctx context.Context, run *machine.Run) error {
		select {
		case err := <-g.of(run.Task.Kind):
			if err != nil {
				return machine.NonRetryable(err)
			}
			return run.Complete(ctx, json.RawMessage(`{"found": "sunny, 21 °C"}`))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fanOut := func(kinds ...string) machine.Handler {
		return func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "gathering" {
				return run.Complete(ctx, json.RawMessage(`{"answer": "done"}`))
			}
			ps := make([]machine.SpawnParams, len(kinds))
			for i, k := range kinds {
				ps[i] = machine.SpawnParams{Kind: k, Input: json.RawMessage(`{"query": "weather in Lyon"}`)}
			}
			children, err := run.SpawnMany(ctx, ps)
			if err != nil {
				return err
			}
			ids := make([]int64, len(children))
			for i, c := range children {
				ids[i] = c.ID
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: "gathering"})
		}
	}
	return map[string]machine.Handler{
		"chat_turn":  fanOut("search_web", "read_docs", "sub_agent"),
		"sub_agent":  fanOut("browse", "browse_more"),
		"search_web": tool, "read_docs": tool, "browse": tool, "browse_more": tool,
	}
}

func TestBrowser(t *testing.T) {
	// Not parallel: it measures a change's latency, which the other tests
	// (each a Chromium of its own) would load.
	pool, schema := testdb.Fresh(t)
	ctx := context.Background()
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	g := &gates{m: map[string]chan error{}}
	runner, err := machine.NewRunner(engine, g.handlers(), &machine.RunnerConfig{})
	require.NoError(t, err)
	require.NoError(t, runner.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, runner.Stop(sctx))
	})
	h, err := arborui.NewHandler(engine, &arborui.Options{Prefix: "/arbor", Actions: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	conv := "chat-" + testdb.Conversation(t)
	turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "chat_turn",
		Input: json.RawMessage(`{"message": "What's the weather in Lyon? <b>now</b>"}`)})
	require.NoError(t, err)
	tree := waitTree(t, ctx, engine, conv, 6)
	sel := func(kind, status string) string {
		return fmt.Sprintf(`#task-%d[data-status=%q]`, tree[kind].ID, status)
	}

	b := browser(t)
	page := srv.URL + "/arbor/conversation?id=" + url.QueryEscape(conv)
	require.NoError(t, chromedp.Do(b,
		chromedp.Navigate(page),
		chromedp.WaitVisible(sel("browse", "running")),
		chromedp.WaitVisible(fmt.Sprintf(`#task-%d[data-status="waiting"]`, turn.ID)),
		chromedp.WaitVisible(`#live-status.on`),
	), "the page shows the running tree")
	// A mark on the page's window: a reload would lose it.
	loaded, err := chromedp.Run(b, chromedp.Evaluate[string](`window.arborMark = "same page"; window.arborMark`))
	require.NoError(t, err)
	require.Equal(t, "same page", loaded)

	// The test completes one tool and fails another; the page shows both
	// without a reload. The page notes when each first shows (a
	// MutationObserver, on the same clock as the test): the figure printed is
	// release → shown, an upper bound of commit → shown (it includes the
	// handler's own Complete), not asserted.
	_, err = chromedp.Run(b, chromedp.Evaluate[bool](fmt.Sprintf(`(() => {
		const want = %q;
		const seen = () => { if (!window.arborSeen && document.querySelector(want)) { window.arborSeen = Date.now(); } };
		new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, attributes: true});
		return true;
	})()`, sel("search_web", "completed"))))
	require.NoError(t, err)
	released := time.Now()
	g.release("search_web", nil)
	g.release("read_docs", errors.New("docs server returned 503"))
	require.NoError(t, chromedp.Do(b,
		chromedp.WaitVisible(sel("search_web", "completed")),
		chromedp.WaitVisible(sel("read_docs", "failed")),
	), "the changes appear")
	seenAt, err := chromedp.Run(b, chromedp.Evaluate[float64](`window.arborSeen || 0`))
	require.NoError(t, err)
	require.NotZero(t, seenAt, "the observer saw the completed tool")
	t.Logf("a tool's completion shown %d ms after the test released it (upper bound of commit → DOM; goal 100 ms)",
		int64(seenAt)-released.UnixMilli())
	mark, err := chromedp.Run(b, chromedp.Evaluate[string](`window.arborMark`))
	require.NoError(t, err)
	require.Equal(t, "same page", mark, "the page was not reloaded")
	// The screenshot (the README's, with ARBOR_UI_SCREENSHOT=docs/ui.png):
	// a turn with a tool completed, one failed and a sub-agent browsing.
	png, err := chromedp.Run(b, chromedp.FullScreenshot(100)) // 100: PNG
	require.NoError(t, err)

	shot := filepath.Join(t.TempDir(), "ui.png")
	if p := os.Getenv("ARBOR_UI_SCREENSHOT"); p != "" {
		shot = p
	}
	require.NoError(t, os.WriteFile(shot, png, 0o644))
	t.Logf("screenshot: %s", shot)

	// The abort button of the sub-agent aborts it and its subtree.
	require.NoError(t, chromedp.Do(b,
		clickLive(fmt.Sprintf(`button[data-abort="%d"]`, tree["sub_agent"].ID)),
		chromedp.WaitVisible(sel("sub_agent", "aborted")),
		chromedp.WaitVisible(sel("browse", "aborted")),
		chromedp.WaitVisible(fmt.Sprintf(`#task-%d[data-status="completed"]`, turn.ID)),
		chromedp.WaitVisible(`#live-status.on`),
	), "the abort button aborts")

	for _, kind := range []string{"sub_agent", "browse", "browse_more"} {
		got, err := engine.Get(ctx, tree[kind].ID)
		require.NoError(t, err)
		require.Equal(t, arbortype.StatusAborted, got.Status, kind)
	}
	sub, err := engine.Get(ctx, tree["sub_agent"].ID)
	require.NoError(t, err)
	require.Equal(t, "stopped from the web view", sub.Error.Message)
}

// waitTree follows conv's log until it has n tasks, and returns them by
// kind.
func waitTree(t *testing.T, ctx context.Context, engine *tasks.Engine, conv string, n int) map[string]arbortype.Task {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	byKind := map[string]arbortype.Task{}
	enough := errors.New("enough")
	err := engine.Follow(ctx, conv, 0, func(arbortype.LogEntry) error {
		all, err := engine.ConversationTasks(ctx, conv)
		if err != nil {
			return err
		}
		running := 0
		for _, task := range all {
			byKind[task.Kind] = task
			if task.Status == arbortype.StatusRunning {
				running++
			}
		}
		if len(all) == n && running == 4 {
			return enough
		}
		return nil
	})
	require.ErrorIs(t, err, enough, "the turn's tree")
	return byKind
}
