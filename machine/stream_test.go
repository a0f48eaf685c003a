package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
)

// streamHandlers: a turn publishes three progress entries, spawns a tool,
// waits for it and completes; release lets it go on after its first
// progress entry.
func streamHandlers(release <-chan struct{}) map[string]machine.Handler {
	return map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == "answer" {
				if err := run.Progress(ctx, "token", json.RawMessage(`"done"`)); err != nil {
					return err
				}
				return run.Complete(ctx, json.RawMessage(`"answer"`))
			}
			if err := run.Progress(ctx, "token", json.RawMessage(`"Hel"`)); err != nil {
				return err
			}
			<-release
			if err := run.Progress(ctx, "token", json.RawMessage(`"lo"`)); err != nil {
				return err
			}
			tool, err := run.Spawn(ctx, machine.SpawnParams{Kind: "tool"})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{tool.ID}, Policy: arbortype.AllSettled, Phase: "answer"})
		},
		"tool": func(ctx context.Context, run *machine.Run) error { return run.Complete(ctx, nil) },
	}
}

// The conversation's log has every status change of every task and the
// handlers' progress, in commit order; a follower from the start sees it
// all live, and one attaching mid-turn with the cursor it was given sees
// every later entry, the turn's settle included (vercel/eve #809: a
// subscriber attaching mid-turn missed the terminal event).
func TestFollowTheConversation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	fastRunner(t, b, streamHandlers(release), func(c *machine.RunnerConfig) { c.PollInterval = 10 * time.Second })
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(b.ctx, eventually)
	defer cancel()
	var mu sync.Mutex
	var early []arbortype.LogEntry
	earlyDone := make(chan error, 1)
	go func() {
		earlyDone <- b.engine.Follow(ctx, b.conv, 0, func(en arbortype.LogEntry) error {
			mu.Lock()
			early = append(early, en)
			mu.Unlock()
			if en.TaskID == turn.ID && en.Terminal() {
				return errStop
			}
			return nil
		})
	}()
	// Mid-turn: the turn has published its first token.
	var cursor int64
	waitUntil(t, "the first progress entry", func() bool {
		log, err := b.engine.ReadLog(b.ctx, b.conv, 0, 100)
		require.NoError(t, err)
		for _, en := range log {
			if en.Kind == arbortype.LogKindProgress {
				cursor = en.Seq
				return true
			}
		}
		return false
	})
	var late []arbortype.LogEntry
	lateDone := make(chan error, 1)
	go func() {
		lateDone <- b.engine.Follow(ctx, b.conv, cursor, func(en arbortype.LogEntry) error {
			late = append(late, en)
			if en.TaskID == turn.ID && en.Terminal() {
				return errStop
			}
			return nil
		})
	}()
	close(release)
	require.ErrorIs(t, <-earlyDone, errStop)
	require.ErrorIs(t, <-lateDone, errStop)

	all, err := b.engine.ReadLog(b.ctx, b.conv, 0, 1000)
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, all, early, "the follower from the start saw the whole log, in order")
	mu.Unlock()
	var after []arbortype.LogEntry
	for _, en := range all {
		if en.Seq > cursor {
			after = append(after, en)
		}
	}
	require.Equal(t, after, late, "the late follower saw every entry after its cursor, the settle included")
	var tokens []string
	statuses := map[string][]string{}
	for i, en := range all {
		if i > 0 {
			require.Greater(t, en.Seq, all[i-1].Seq)
		}
		switch en.Kind {
		case arbortype.LogKindProgress:
			tokens = append(tokens, string(en.Payload))
		case arbortype.LogKindStatus:
			statuses[en.Name] = append(statuses[en.Name], string(en.Status))
		}
	}
	require.Equal(t, []string{`"Hel"`, `"lo"`, `"done"`}, tokens)
	// The turn started by its create (docs/design.md §3.18) was never
	// pending; one the runner claimed was.
	turnStatuses := []string{"running", "waiting", "pending", "running", "completed"}
	if turn.Status == arbortype.StatusPending {
		turnStatuses = append([]string{"pending"}, turnStatuses...)
	}
	require.Equal(t, map[string][]string{
		"turn": turnStatuses,
		"tool": {"pending", "running", "completed"},
	}, statuses, "every status change of every task, in order")
	b.requireClean(t)
}

var errStop = errors.New("stop")

// AwaitSettled returns a turn's result from outside the runner, promptly
// after its commit, without polling; at once for a settled task; bounded
// by its context.
func TestAwaitSettled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	fastRunner(t, b, streamHandlers(release), func(c *machine.RunnerConfig) { c.PollInterval = 10 * time.Second })
	turn, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
	require.NoError(t, err)

	short, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
	_, err = b.engine.AwaitSettled(short, turn.ID)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "bounded by its context while the turn is blocked")

	got := make(chan arbortype.Task, 3)
	for range 3 {
		go func() {
			task, err := b.engine.AwaitSettled(b.ctx, turn.ID)
			if err != nil {
				t.Error(err)
			}
			got <- task
		}()
	}
	close(release)
	for range 3 {
		task := <-got
		require.Equal(t, arbortype.StatusCompleted, task.Status)
		require.JSONEq(t, `"answer"`, string(task.Result))
	}
	again, err := b.engine.AwaitSettled(b.ctx, turn.ID)
	require.NoError(t, err)
	require.Equal(t, arbortype.StatusCompleted, again.Status)
	b.requireClean(t)
}

// A task past its deadline fails with code deadline_exceeded, whatever it
// is doing (here: waiting on a tool that blocks), and its foreground
// subtree is aborted; a spawned child's deadline works alike.
func TestDeadlines(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fastRunner(t, b, map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			tool, err := run.Spawn(ctx, machine.SpawnParams{Kind: "tool"})
			if err != nil {
				return err
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: []int64{tool.ID}, Policy: arbortype.AllSettled, Phase: "after"})
		},
		"tool": func(ctx context.Context, run *machine.Run) error {
			<-ctx.Done() // blocks until its task is taken from it
			return context.Cause(ctx)
		},
		"slow": func(ctx context.Context, run *machine.Run) error {
			<-ctx.Done()
			return context.Cause(ctx)
		},
	}, nil)
	// The deadline must pass while the turn waits on its tool: a machine
	// busy enough to take longer than the deadline to run the turn at all
	// fails it before it spawned anything (its handler never ran, which is
	// right, but not what this test looks at). Then it tries again, in a
	// conversation of its own, with twice the deadline.
	var (
		turn  arbortype.Task
		kids  []arbortype.Task
		convs []string
	)
	for wait := 300 * time.Millisecond; len(kids) == 0; wait *= 2 {
		require.Less(t, wait, 20*time.Second, "the turn never spawned its tool before its deadline")
		conv := fmt.Sprintf("%s-%d", b.conv, wait.Milliseconds())
		if len(convs) == 0 {
			conv = b.conv
		}
		convs = append(convs, conv)
		var err error
		turn, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Deadline: time.Now().Add(wait)})
		require.NoError(t, err)
		waitUntil(t, "the turn to fail past its deadline", func() bool { return b.status(t, turn.ID) == arbortype.StatusFailed })
		require.Equal(t, "deadline_exceeded", b.get(t, turn.ID).Error.Code)
		kids, err = b.engine.Children(b.ctx, turn.ID)
		require.NoError(t, err)
	}
	require.Len(t, kids, 1)
	// Aborted when the tool had started by the deadline, orphaned when it
	// had not (a busy machine can take longer than the deadline to start it):
	// either way the abort reached it.
	require.Contains(t, []arbortype.Status{arbortype.StatusAborted, arbortype.StatusOrphaned}, kids[0].Status, "its subtree was aborted")

	slow, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-2", Kind: "slow", Deadline: time.Now().Add(200 * time.Millisecond)})
	require.NoError(t, err)
	waitUntil(t, "the running task to fail past its deadline", func() bool { return b.status(t, slow.ID) == arbortype.StatusFailed })
	require.Equal(t, "deadline_exceeded", b.get(t, slow.ID).Error.Code)
	b.requireClean(t, append(convs, b.conv+"-2")...)
}

// CompleteTx commits a run's completion with the handler's own rows, or
// neither: a transaction that does not commit leaves the task running, and
// the runner fails the run (retried, here once, successfully).
func TestCompleteTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE `+b.schema+`.messages (task_id bigint, body text)`)
	require.NoError(t, err)
	var mu sync.Mutex
	calls := map[int64]int{}
	fastRunner(t, b, map[string]machine.Handler{
		"reply": func(ctx context.Context, run *machine.Run) error {
			mu.Lock()
			calls[run.Task.ID]++
			first := calls[run.Task.ID] == 1
			mu.Unlock()
			tx, err := b.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `INSERT INTO `+b.schema+`.messages VALUES ($1, 'hello')`, run.Task.ID); err != nil {
				return err
			}
			if err := run.CompleteTx(ctx, tx, json.RawMessage(`"sent"`)); err != nil {
				return err
			}
			if first && run.Task.Input != nil {
				return nil // rolled back: the completion did not land
			}
			return tx.Commit(ctx)
		},
	}, nil)
	ok, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "reply"})
	require.NoError(t, err)
	flaky, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-2", Kind: "reply",
		Input: json.RawMessage(`{"roll back": "the first time"}`), MaxRetries: 1, RetryBackoffBase: time.Millisecond})
	require.NoError(t, err)
	for _, id := range []int64{ok.ID, flaky.ID} {
		waitUntil(t, "the reply to complete", func() bool { return b.status(t, id) == arbortype.StatusCompleted })
		var n int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.schema+`.messages WHERE task_id = $1`, id).Scan(&n))
		require.Equal(t, 1, n, "the message and the completion landed together, once")
	}
	got := b.get(t, flaky.ID)
	require.Equal(t, 1, got.Retries, "the run whose transaction did not commit failed, and was retried")
	require.Equal(t, arbortype.CodeEndingNotCommitted, got.ErrorHistory[0].Code)
	b.requireClean(t, b.conv+"-2")
}
