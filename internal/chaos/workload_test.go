package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// The workload. Every conversation has one turn, whose tree is:
//
//	turn                      waits all_settled on its seven children, then
//	│                         completes with their outcomes
//	├── tool0, tool1, tool2   work 40/80/120 ms (heartbeats), checkpoint, complete
//	├── group                 waits fail_fast on its three children, then
//	│   │                     completes with their outcomes
//	│   ├── sibling0, sibling1  sleep an hour: only the fail_fast abort ends them
//	│   └── doomed            once both siblings sleep, fails non-retryable
//	├── nap                   sleeps 300 ms, completes after waking
//	├── flaky                 fails its first try, completes on the retry
//	│                         (MaxRetries 2, 20–40 ms backoff)
//	└── once                  abandon_on_restart: works 100 ms, completes
//
// Eleven tasks, every one with an expected end: everything completed but
// the siblings (aborted), doomed (failed, with its own message) and once
// (completed, or cancelled with abandoned_on_restart when a crash or a
// take-over cut its run).
//
// Every document a run writes through arbor carries the run that wrote it
// ({"by": {"token", "node"}, "value": …}): results, checkpoint, wait and
// sleep states, and the input of the children it spawns; the messages of
// the designed failures end with "(token N)". The audit trigger
// (auditDDL) compares that token with the task's token at the moment the
// write lands, which is how a stale write would show.
//
// Tools are stubborn: they ignore their context and go on to their
// checkpoint and Complete even after a refused heartbeat, so that a run cut
// off by a take-over (a frozen process that resumes) does try to write, and
// its writes are seen refused.

const (
	turnKind    = "turn"
	restartSafe = 100 // every task's restart_limit: see setup
	napFor      = 300 * time.Millisecond
	pollFor     = 50 * time.Millisecond // doomed's poll of its siblings
	siblingNap  = time.Hour
	stepFor     = 20 * time.Millisecond
)

// childSpec is one child the turn spawns.
type childSpec struct {
	name   string
	kind   string
	value  map[string]any
	params machine.SpawnParams
}

func turnChildren() []childSpec {
	return []childSpec{
		{name: "tool0", kind: "tool", value: map[string]any{"work_ms": 40}},
		{name: "tool1", kind: "tool", value: map[string]any{"work_ms": 80}},
		{name: "tool2", kind: "tool", value: map[string]any{"work_ms": 120}},
		{name: "group", kind: "group"},
		{name: "nap", kind: "nap"},
		{name: "flaky", kind: "flaky", params: machine.SpawnParams{MaxRetries: 2,
			RetryBackoffBase: 20 * time.Millisecond, RetryBackoffCap: 40 * time.Millisecond}},
		{name: "once", kind: "once", value: map[string]any{"work_ms": 100},
			params: machine.SpawnParams{AbandonOnRestart: true}},
	}
}

// tasksPerTurn is how many tasks one turn's tree has.
const tasksPerTurn = 11

// Designed failures' messages: fmt formats, then the patterns the check
// accepts.
const (
	doomedMessage  = "doomed: the tool refused the call (token %d)"
	flakyMessage   = "flaky: upstream returned 503 (token %d)"
	doomedPattern  = `^doomed: the tool refused the call \(token [0-9]+\)$`
	flakyPattern   = `^flaky: upstream returned 503 \(token [0-9]+\)$`
	abandonedCode  = arbortype.CodeAbandonedOnRestart
	restartLimCode = arbortype.CodeRestartLimitExceeded
)

// by names the run that wrote a document.
type by struct {
	Token int64  `json:"token"`
	Node  string `json:"node"`
}

// stamped is every document the workload's runs write.
type stamped struct {
	By    by              `json:"by"`
	Value json.RawMessage `json:"value,omitempty"`
}

// outcome is a child's end as its owner saw it.
type outcome struct {
	Status arbortype.Status `json:"status"`
	Value  json.RawMessage  `json:"value"`
}

// worker runs the workload's handlers in one runner process, logging every
// run in run_log (on its pool, outside arbor's transactions).
type worker struct {
	pool   *pgxpool.Pool
	schema string
	node   string
	engine *tasks.Engine
}

func (w *worker) handlers() map[string]machine.Handler {
	return map[string]machine.Handler{
		turnKind: w.turn, "tool": w.tool, "group": w.group, "sibling": w.sibling,
		"doomed": w.doomed, "nap": w.nap, "flaky": w.flaky, "once": w.once,
	}
}

func (w *worker) stamp(run *machine.Run, value any) json.RawMessage {
	s := stamped{By: by{Token: run.Task.Token, Node: w.node}}
	if value != nil {
		v, err := json.Marshal(value)
		if err != nil {
			panic(err)
		}
		s.Value = v
	}
	out, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return out
}

// valueOf returns the value of a stamped document (nil for none).
func valueOf(doc json.RawMessage) json.RawMessage {
	var s stamped
	if len(doc) == 0 || json.Unmarshal(doc, &s) != nil {
		return nil
	}
	return s.Value
}

// nameOf returns the name a child was spawned with (in its input's value).
func nameOf(t arbortype.Task) string {
	var v struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(valueOf(t.Input), &v)
	return v.Name
}

// entry is one run_log row: one call of a handler.
type entry struct {
	w       *worker
	id      int64
	refused int
}

// Statements of the run log, by the database's clock. A call's start is
// when its row was inserted, the first thing the handler does: nothing of
// the call happened before. Its end is a reading of the clock taken before
// it issues its ending write, so it is never later than that write, even
// when a fault (a restart, a terminated connection, retried below) delays
// the statement that records it.
const (
	logStartSQL = `INSERT INTO %s.run_log (id, task_id, token, node, kind, attempt, started_at)
		VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp()) ON CONFLICT (id) DO NOTHING`
	logEndSQL = `UPDATE %s.run_log SET ended_at = $2, outcome = $3, refused = $4 WHERE id = $1`
)

// begin logs the start of a call of a handler. A run log that cannot be
// written for two minutes is the database's unavailability, not the
// handler's failure: the runner calls the handler again when it is back.
func (w *worker) begin(run *machine.Run) (*entry, error) {
	e := &entry{w: w, id: rand.Int64()}
	err := w.exec(func(ctx context.Context, db *pgxpool.Pool) error {
		_, err := db.Exec(ctx, fmt.Sprintf(logStartSQL, w.schema), e.id, run.Task.ID, run.Task.Token, w.node, run.Task.Kind, run.Task.Attempt)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("run_log: %w: %w", tasks.ErrUnavailable, err)
	}
	return e, nil
}

// note counts a write of the run that arbor refused (the run is over) and
// returns err.
func (e *entry) note(err error) error {
	if refusedErr(err) {
		e.refused++
	}
	return err
}

// finish issues the run's ending call (or returns the handler's error)
// and logs the end, as the database's clock read just before: a later run
// of the task may start as soon as the ending write commits, before this
// process gets to log anything.
func (e *entry) finish(ending func() error) error {
	var at time.Time
	if err := e.w.exec(func(ctx context.Context, db *pgxpool.Pool) error {
		return db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at)
	}); err != nil {
		return fmt.Errorf("run_log: %w: %w", tasks.ErrUnavailable, err)
	}
	err := e.note(ending())
	out := "ok"
	switch {
	case refusedErr(err):
		out = "refused: " + err.Error()
	case err != nil:
		out = "error: " + err.Error()
	}
	if lerr := e.w.exec(func(ctx context.Context, db *pgxpool.Pool) error {
		_, err := db.Exec(ctx, fmt.Sprintf(logEndSQL, e.w.schema), e.id, at, out, e.refused)
		return err
	}); lerr != nil && err == nil {
		return fmt.Errorf("run_log: %w: %w", tasks.ErrUnavailable, lerr)
	}
	return err
}

func refusedErr(err error) bool {
	return errors.Is(err, tasks.ErrLeaseLost) || errors.Is(err, tasks.ErrNotRunning) || errors.Is(err, tasks.ErrAborted)
}

// exec runs a run-log statement, again after each error (a terminated
// connection, a restarting server) for up to two minutes. The statements
// are idempotent: a try whose commit was lost and that is made again
// changes nothing more.
func (w *worker) exec(fn func(ctx context.Context, db *pgxpool.Pool) error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := fn(ctx, w.pool)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
	}
}

// work spends d in steps, heartbeating after each. stubborn goes on after
// a refused heartbeat (and ignores ctx); otherwise the refusal is returned.
func (e *entry) work(ctx context.Context, run *machine.Run, d time.Duration, stubborn bool) error {
	for range int(d / stepFor) {
		if !stubborn && ctx.Err() != nil {
			return context.Cause(ctx)
		}
		time.Sleep(stepFor)
		if err := e.note(run.Heartbeat(ctx)); err != nil && !stubborn {
			return err
		}
	}
	return nil
}

func input[T any](run *machine.Run) T {
	var v T
	_ = json.Unmarshal(valueOf(run.Task.Input), &v)
	return v
}

func (w *worker) turn(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	if run.Task.Phase == "gathering" {
		waited, err := run.Waited(ctx)
		if err != nil {
			return e.finish(func() error { return err })
		}
		outs := map[string]outcome{}
		for _, c := range waited {
			outs[nameOf(c)] = outcome{Status: c.Status, Value: valueOf(c.Result)}
		}
		return e.finish(func() error { return run.Complete(ctx, w.stamp(run, outs)) })
	}
	var ids []int64
	for _, c := range turnChildren() {
		value := map[string]any{"name": c.name}
		for k, v := range c.value {
			value[k] = v
		}
		p := c.params
		p.Kind, p.Input = c.kind, w.stamp(run, value)
		// A key of the turn's own: a turn run again after a crash finds the
		// children its first run spawned.
		p.IdempotencyKey = fmt.Sprintf("%d/%s", run.Task.ID, c.name)
		child, err := run.Spawn(ctx, p)
		if err != nil {
			return e.finish(func() error { return err })
		}
		ids = append(ids, child.ID)
	}
	return e.finish(func() error {
		return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled,
			Phase: "gathering", State: w.stamp(run, nil)})
	})
}

func (w *worker) tool(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	in := input[struct {
		Name   string `json:"name"`
		WorkMS int    `json:"work_ms"`
	}](run)
	_ = e.work(ctx, run, time.Duration(in.WorkMS)*time.Millisecond, true)
	_ = e.note(run.Checkpoint(ctx, "worked", w.stamp(run, map[string]any{"work_ms": in.WorkMS})))
	return e.finish(func() error { return run.Complete(ctx, w.stamp(run, map[string]any{"tool": in.Name})) })
}

func (w *worker) group(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	if run.Task.Phase == "deciding" {
		waited, err := run.Waited(ctx)
		if err != nil {
			return e.finish(func() error { return err })
		}
		v := struct {
			Doomed   arbortype.Status   `json:"doomed"`
			Siblings []arbortype.Status `json:"siblings"`
		}{}
		for _, c := range waited {
			if c.Kind == "doomed" {
				v.Doomed = c.Status
			} else {
				v.Siblings = append(v.Siblings, c.Status)
			}
		}
		return e.finish(func() error { return run.Complete(ctx, w.stamp(run, v)) })
	}
	spawn := func(kind, name string, value map[string]any) (int64, error) {
		value["name"] = name
		c, err := run.Spawn(ctx, machine.SpawnParams{Kind: kind, Input: w.stamp(run, value),
			IdempotencyKey: fmt.Sprintf("%d/%s", run.Task.ID, name)})
		return c.ID, err
	}
	var ids []int64
	for i := range 2 {
		id, err := spawn("sibling", fmt.Sprint("sibling", i), map[string]any{})
		if err != nil {
			return e.finish(func() error { return err })
		}
		ids = append(ids, id)
	}
	doomed, err := spawn("doomed", "doomed", map[string]any{"siblings": ids})
	if err != nil {
		return e.finish(func() error { return err })
	}
	return e.finish(func() error {
		return run.Wait(ctx, machine.WaitParams{ChildIDs: append(ids, doomed), Policy: arbortype.FailFast,
			Phase: "deciding", State: w.stamp(run, nil)})
	})
}

func (w *worker) sibling(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	if run.Task.Phase == "parked" { // never: the group's fail_fast aborts it first
		return e.finish(func() error { return run.Complete(ctx, w.stamp(run, map[string]any{"woke": true})) })
	}
	return e.finish(func() error {
		return run.SleepUntil(ctx, time.Now().Add(siblingNap), "parked", w.stamp(run, nil))
	})
}

// doomed fails once both its siblings sleep, so that the fail_fast abort
// always finds them started (aborted, not orphaned).
func (w *worker) doomed(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	in := input[struct {
		Siblings []int64 `json:"siblings"`
	}](run)
	sibs, err := w.engine.GetMany(ctx, in.Siblings)
	if err != nil {
		return e.finish(func() error { return err })
	}
	for _, s := range sibs {
		if s.Status != arbortype.StatusSleeping {
			return e.finish(func() error {
				return run.SleepUntil(ctx, time.Now().Add(pollFor), "", w.stamp(run, nil))
			})
		}
	}
	return e.finish(func() error {
		return machine.NonRetryable(fmt.Errorf(doomedMessage, run.Task.Token))
	})
}

func (w *worker) nap(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	if run.Task.Phase == "woke" {
		return e.finish(func() error { return run.Complete(ctx, w.stamp(run, map[string]any{"slept": true})) })
	}
	return e.finish(func() error { return run.SleepUntil(ctx, time.Now().Add(napFor), "woke", w.stamp(run, nil)) })
}

func (w *worker) flaky(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	if run.Task.Retries == 0 {
		return e.finish(func() error { return fmt.Errorf(flakyMessage, run.Task.Token) })
	}
	return e.finish(func() error {
		return run.Complete(ctx, w.stamp(run, map[string]any{"retries": run.Task.Retries}))
	})
}

func (w *worker) once(ctx context.Context, run *machine.Run) error {
	e, err := w.begin(run)
	if err != nil {
		return err
	}
	in := input[struct {
		WorkMS int `json:"work_ms"`
	}](run)
	if err := e.work(ctx, run, time.Duration(in.WorkMS)*time.Millisecond, false); err != nil {
		return e.finish(func() error { return err })
	}
	return e.finish(func() error { return run.Complete(ctx, w.stamp(run, map[string]any{"once": true})) })
}
