package machine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// AwaitParams describe an await of an event.
type AwaitParams struct {
	// Name is the event awaited (tasks.EmitParams.Name). Required.
	Name string
	// Timeout, when not 0, ends the await without an event after it
	// (durably: a River job and a local timer, as a sleep's); the handler
	// then runs with run.Task.Delivered.TimedOut. 0: no timeout.
	Timeout time.Duration
	// Phase and State are saved with the await: the handler runs again from
	// them.
	Phase string
	State json.RawMessage
}

// AwaitEvent ends the run, parking the task until an event named p.Name is
// emitted to it or to its conversation (tasks.Engine.Emit, EmitToken, the
// arbor emit command), or until p.Timeout; the handler then runs again with
// run.Task.Phase = p.Phase and what woke it in run.Task.Delivered (the
// event's payload, or TimedOut). An event emitted before the await parks is
// not lost: the await takes it and the task runs again at once. While it is
// parked, the await is listed by tasks.Engine.PendingEvents with the token
// a client posts back to answer exactly it (run.Task.AwaitToken once the
// handler runs again; the conversation's log shows the park). The handler
// returns after AwaitEvent.
func (r *Run) AwaitEvent(ctx context.Context, p AwaitParams) error {
	if strings.HasPrefix(p.Name, "arbor:") {
		// arbortype.BudgetEvent is awaited by a budget's park, and emitted
		// only by a raise: an await of it would take a raise meant for a
		// park, and be answered by nothing else.
		return fmt.Errorf("await of task %d: event name %q: the prefix \"arbor:\" is arbor's own: %w", r.id, p.Name, arbortype.ErrInvalidArgument)
	}
	return r.finish(ctx, core.Outcome{Kind: core.OutAwait, Await: core.AwaitParams(p)})
}

// Progress publishes payload (JSON, at most 64 KiB) on the conversation's
// log, labelled name: what a client following the conversation
// (tasks.Engine.Follow) sees while the handler works — tokens of a streamed
// answer, a tool's status. Unlike Checkpoint it does not change what the
// handler resumes from. Fenced by the run's token; one statement, which
// commits on its own.
func (r *Run) Progress(ctx context.Context, name string, payload json.RawMessage) error {
	_, err := writeAtOnce(ctx, r, func(ctx context.Context, db store.DB) (int64, error) {
		return r.core.Progress(ctx, db, r.conv, r.id, r.token, name, payload)
	})
	if err == nil {
		r.core.AnnounceLog(r.conv)
	}
	r.over(err)
	return err
}

// The …Tx forms write in the caller's transaction, for a handler that
// commits the run's write together with rows of its own (the assistant's
// message and the turn's completion). They bypass the runner's batching:
// the write lands if, and only if, tx commits.

// CompleteTx is Complete inside tx. The run counts as ended; return nil
// after tx commits. If tx does not commit, the runner finds the task still
// running under this run when the handler returns and fails the run (code
// "ending_not_committed", retried under the task's policy).
func (r *Run) CompleteTx(ctx context.Context, tx pgx.Tx, result json.RawMessage) error {
	leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	_, err = core.Savepoint(ctx, tx, func(tx pgx.Tx) (arbortype.Task, error) {
		return r.core.Complete(ctx, tx, r.id, r.token, result)
	})
	if err == nil {
		r.mu.Lock()
		r.ended, r.endedInTx = true, true
		r.outcome = Outcome{Kind: OutcomeCompleted}
		r.mu.Unlock()
	}
	r.over(err)
	return err
}

// SpawnTx is Spawn inside tx: the child exists only if tx commits.
func (r *Run) SpawnTx(ctx context.Context, tx pgx.Tx, p SpawnParams) (arbortype.Task, error) {
	leave, err := r.enter(ctx)
	if err != nil {
		return arbortype.Task{}, err
	}
	defer leave()
	cps, err := r.spawnParams(ctx, []SpawnParams{p})
	if err != nil {
		return arbortype.Task{}, err
	}
	kids, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) ([]arbortype.Task, error) {
		kids, _, err := r.core.CreateMany(ctx, tx, cps)
		return kids, err
	})
	r.over(err)
	if err != nil {
		return arbortype.Task{}, err
	}
	return kids[0], nil
}

// CheckpointTx is Checkpoint inside tx.
func (r *Run) CheckpointTx(ctx context.Context, tx pgx.Tx, phase string, state json.RawMessage) error {
	leave, err := r.enter(ctx)
	if err != nil {
		return err
	}
	defer leave()
	t, err := core.Savepoint(ctx, tx, func(tx pgx.Tx) (arbortype.Task, error) {
		return r.core.Checkpoint(ctx, tx, r.conv, r.id, r.token, phase, state)
	})
	if err == nil {
		r.Task.Phase, r.Task.State = t.Phase, t.State
		r.extended()
	}
	r.over(err)
	return err
}

// endedInTx reports whether the run was ended by a …Tx form.
func (r *Run) endedInTxForm() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.endedInTx
}

// confirmTxEnding checks, once the handler returned, that the transaction
// its CompleteTx wrote in committed: a task still running under this run
// means it did not, and the run fails (retried under the task's policy).
func confirmTxEnding(ctx context.Context, c *core.Engine, run *Run) {
	cur, err := c.Get(ctx, c.Pool, run.id)
	if err != nil || cur.Status != arbortype.StatusRunning || cur.Token != run.token {
		return
	}
	run.mu.Lock()
	run.ended, run.endedInTx = false, false
	run.mu.Unlock()
	te := arbortype.TaskError{Code: arbortype.CodeEndingNotCommitted,
		Message: fmt.Sprintf("the handler of task %d ended its run with CompleteTx, and that transaction did not commit", run.id)}
	_ = run.finish(ctx, core.Outcome{Kind: core.OutFail, Error: te})
}
