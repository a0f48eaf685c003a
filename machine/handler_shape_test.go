package machine_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// readmeTurn is the README's turn handler (ExampleRunner's), with one hook
// between the spawns and the wait: the place where, before waits always
// ended the run, a child quicker than the wait made the handler go on and
// complete the turn with a null result.
func readmeTurn(beforeWait func(), entered *int, mu *sync.Mutex) machine.Handler {
	return func(ctx context.Context, run *machine.Run) error {
		mu.Lock()
		*entered++
		mu.Unlock()
		if run.Task.Phase == "gathering" {
			results, err := run.Waited(ctx)
			if err != nil {
				return err
			}
			answer, err := summarize(results)
			if err != nil {
				return err
			}
			return run.Complete(ctx, answer)
		}
		search, err := run.Spawn(ctx, machine.SpawnParams{Kind: "search"})
		if err != nil {
			return err
		}
		fetch, err := run.Spawn(ctx, machine.SpawnParams{Kind: "fetch"})
		if err != nil {
			return err
		}
		beforeWait()
		return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{search.ID, fetch.ID},
			Policy: arbortype.FailFast, Phase: "gathering"})
	}
}

// TestReadmeHandlerCannotLoseTheResult drives the race of the README's
// handler both ways, deterministically: the children settle before the
// turn's wait is written (the wait finds them settled and wakes the turn in
// its own transaction), and after it (the last child's settle wakes the
// parked turn). Either way the turn runs again from "gathering" exactly once
// and completes with both children's results.
func TestReadmeHandlerCannotLoseTheResult(t *testing.T) {
	t.Parallel()
	for _, childrenFirst := range []bool{true, false} {
		name := map[bool]string{true: "children_settle_before_the_wait", false: "children_settle_after_the_wait"}[childrenFirst]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var (
				mu      sync.Mutex
				entered int
				settled sync.WaitGroup // the children's Completes, committed
				release = make(chan struct{})
			)
			settled.Add(2)
			child := func(result string) machine.Handler {
				return func(ctx context.Context, run *machine.Run) error {
					if !childrenFirst {
						<-release // the turn's wait has committed
					}
					err := run.Complete(ctx, []byte(result))
					settled.Done()
					return err
				}
			}
			beforeWait := func() {
				if childrenFirst {
					settled.Wait() // both children settled, before the wait is written
				}
			}
			fastRunner(t, b, map[string]machine.Handler{
				"turn":   readmeTurn(beforeWait, &entered, &mu),
				"search": child(`"3 hits"`),
				"fetch":  child(`"a page"`),
			}, func(c *machine.RunnerConfig) { c.Workers = 4 })

			turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
			require.NoError(t, err)
			if !childrenFirst {
				waitUntil(t, "the turn to park on its children", func() bool { return b.status(t, turn.ID) == arbortype.StatusWaiting })
				close(release)
			}
			waitUntil(t, "the turn to complete", func() bool { return b.status(t, turn.ID) == arbortype.StatusCompleted })
			done, err := b.engine.Get(b.ctx, turn.ID)
			require.NoError(t, err)
			require.JSONEq(t, `["search: \"3 hits\"", "fetch: \"a page\""]`, string(done.Result), "the summary, never null")
			mu.Lock()
			require.Equal(t, 2, entered, "the turn ran twice: spawn and wait, then answer")
			mu.Unlock()
			b.requireClean(t)
		})
	}
}

// TestReadmePoolLeavesTheApplicationRoom: the README's code as written, on
// a pool made with pgxpool's defaults (4 connections on a 2-core machine),
// a Runner on the engine and an AwaitSettled holding its listener, beside
// an application making its own calls — Create, Get, AbortConversation —
// each bounded: every call of the application succeeds (the runner's
// connections are its own, RunnerConfig.Pool), and every turn completes.
// The bound is 30 s: a pool the runner took would keep the application
// waiting for as long as the runner runs, while a call on a starved machine
// (this suite beside a second one on two cores) took over 5 s.
func TestReadmePoolLeavesTheApplicationRoom(t *testing.T) {
	t.Parallel()
	_, schema := testdb.Fresh(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.Equal(t, int32(max(4, runtime.NumCPU())), pool.Config().MaxConns, "pgxpool's defaults")
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	var mu sync.Mutex
	entered := 0
	runner, err := machine.NewRunner(engine, map[string]machine.Handler{
		"turn":   readmeTurn(func() {}, &entered, &mu),
		"search": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, []byte(`"3 hits"`)) },
		"fetch":  func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, []byte(`"a page"`)) },
	}, &machine.RunnerConfig{})
	require.NoError(t, err)
	require.NoError(t, runner.Start(ctx))
	t.Cleanup(func() { require.NoError(t, runner.Stop(context.Background())) })

	conv := testdb.Conversation(t)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() { // a user waiting for a turn's answer, as an HTTP handler does
			defer wg.Done()
			turn, _, err := engine.Create(ctx, arbortype.CreateParams{ConversationID: fmt.Sprintf("%s-%d", conv, i), Kind: "turn"})
			require.NoError(t, err)
			done, err := engine.AwaitSettled(ctx, turn.ID)
			require.NoError(t, err)
			require.Equal(t, arbortype.StatusCompleted, done.Status)
		}()
	}
	for i := range 3 {
		wg.Add(1)
		go func() { // the application's own calls
			defer wg.Done()
			for j := range 10 {
				callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
				c := fmt.Sprintf("%s-app-%d-%d", conv, i, j)
				turn, _, err := engine.Create(callCtx, arbortype.CreateParams{ConversationID: c, Kind: "other"})
				require.NoError(t, err, "the application's Create")
				_, err = engine.Get(callCtx, turn.ID)
				require.NoError(t, err, "the application's Get")
				_, err = engine.AbortConversation(callCtx, c)
				require.NoError(t, err, "the application's AbortConversation")
				cancel()
			}
		}()
	}
	wg.Wait()
}
