package faultharness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// The workload. Every conversation has one turn, whose tree is:
//
//	turn                      waits all_settled on its seven children (and
//	│                         its leaves), then completes with their outcomes
//	├── tool0, tool1          work 40/80 ms in 20 ms steps, a side effect
//	│                         before each, heartbeats; checkpoint, complete
//	├── tool2                 the same for 120 ms, but stubborn (below)
//	├── group                 waits fail_fast on its three children, then
//	│   │                     completes with their outcomes
//	│   ├── sibling0, sibling1  sleep an hour: only the fail_fast abort ends them
//	│   └── doomed            once both siblings sleep, fails non-retryable
//	├── nap                   sleeps 300 ms (in a tree with awaits, 0.3–4 s
//	│                         by conversation, so that wakes fall before,
//	│                         during and after a fault), completes after
//	│                         waking
//	├── flaky                 calls upstream (a side effect), fails its first
//	│                         try, completes on the retry (MaxRetries 2,
//	│                         20–40 ms backoff)
//	├── once                  abandon_on_restart: works 100 ms (side effects),
//	│                         completes
//	├── agent                 only in a tree with awaits (a turn whose input
//	│                         says "awaits": true): reserves 100 tokens of
//	│                         the conversation's budget, calls the model (a
//	│                         side effect), records 60, then awaits the
//	│                         event "approve" (which the test emits:
//	│                         Scenario.AddTurns, Scenario.EmitRest) and
//	│                         completes with its payload
//	├── waiter                only in a tree with awaits: awaits an event
//	│                         nobody emits, with a 1–3 s timeout (a River
//	│                         job and a local timer, as a sleep's),
//	│                         completes when it times out
//	└── leaf000…              only in the fan-out variant (a turn whose input
//	                          says "fan": K): K leaves, spawned with the seven
//	                          in one SpawnMany, each a side effect and a
//	                          complete — so that the turn's flush is large;
//	                          abandon_on_restart when its input also says
//	                          "once_leaves": true (completed, or cancelled
//	                          with abandoned_on_restart, as once)
//
// With Config.ToolKey, tool0, tool1 and tool2 are spawned with that
// ConcurrencyKey (a turn whose input says "tool_key"), so that a limit of
// the key bounds them; with Config.Tenants, the conversations belong to
// those tenants, round robin.
//
// Eleven tasks, thirteen with awaits (plus the leaves), every one with an
// expected end:
// everything completed but the siblings (aborted), doomed (failed, with its
// own message) and once (completed, or cancelled with abandoned_on_restart
// when a kill, a freeze or a cut ended its run).
//
// Every document a run writes through arbor carries the run that wrote it
// ({"by": {"token", "node"}, "value": …}): results, checkpoint, wait and
// sleep states, and the input of the children it spawns; the messages of
// the designed failures end with "(token N)". The audit trigger
// (auditDDL) compares that token with the task's token at the moment the
// write lands, which is how a stale write would show.
//
// Every handler is wrapped (Worker.handler): its entry is the wrapper's
// first act and its return the wrapper's last, each read from the clock at
// that moment and logged in run_log on the worker's own pool, outside
// arbor's transactions; a context.AfterFunc records when the call's
// context was cancelled. The handlers are well-behaved — they return on
// ctx.Done, and check ctx before each side effect, which they log in
// side_effects before it happens — except tool2's kind, "stubborn", which
// ignores its context and goes on to its checkpoint and Complete even
// after a refused heartbeat, so that a run cut off by a take-over (a frozen
// process that resumes) does try to write, and its writes are seen
// refused. Its side effects and its overlaps across nodes are counted
// apart: no runner can stop a handler that ignores its context.

// Kinds of the workload's tasks that the scenarios name.
const (
	// TurnKind is the kind of every conversation's root task.
	TurnKind = "turn"
	// AgentKind is the kind of a tree's agent, which awaits an approval.
	AgentKind = "agent"
	// DoneKind is a task that completes at once: a history for a prune.
	DoneKind = "done"
)

const (
	turnKind     = TurnKind
	agentKind    = AgentKind
	stubbornKind = "stubborn"
	leafKind     = "leaf"
	waiterKind   = "waiter"
	napFor       = 300 * time.Millisecond
	pollFor      = 50 * time.Millisecond // doomed's poll of its siblings
	siblingNap   = time.Hour
	stepFor      = 20 * time.Millisecond
	// The agent's model call: what it reserves and what it records, of the
	// conversation's budget of budgetMax tokens.
	tokenCounter = "tokens"
	reserveFor   = 100
	recordFor    = 60
	budgetMax    = 1000
	approveEvent = "approve"
)

// childSpec is one child the turn spawns.
type childSpec struct {
	name   string
	kind   string
	value  map[string]any
	params machine.SpawnParams
}

// turnInput is a turn's input (its value): the shape of its tree.
type turnInput struct {
	Name string `json:"name"`
	// Fan is the number of leaves beside the tree.
	Fan int `json:"fan"`
	// OnceLeaves makes the leaves abandon_on_restart.
	OnceLeaves bool `json:"once_leaves,omitempty"`
	// Awaits adds the agent and the waiter, and spreads the nap's and the
	// waiter's times by I, the conversation's index.
	Awaits bool `json:"awaits,omitempty"`
	I      int  `json:"i"`
	// ToolKey, when not empty, is the ConcurrencyKey the turn's tool calls
	// (tool0, tool1, tool2) are spawned with (Config.ToolKey).
	ToolKey string `json:"tool_key,omitempty"`
}

// turnChildren is the tree of a turn: with awaits, its nap and its
// waiter's timeout depend on the conversation's index, so that wakes are
// spread over the run.
func turnChildren(in turnInput) []childSpec {
	napMS := int(napFor / time.Millisecond)
	if in.Awaits {
		napMS = 300 + (in.I*211)%3700
	}
	children := []childSpec{
		{name: "tool0", kind: "tool", value: map[string]any{"work_ms": 40}},
		{name: "tool1", kind: "tool", value: map[string]any{"work_ms": 80}},
		{name: "tool2", kind: stubbornKind, value: map[string]any{"work_ms": 120}},
		{name: "group", kind: "group"},
		{name: "nap", kind: "nap", value: map[string]any{"nap_ms": napMS}},
		{name: "flaky", kind: "flaky", params: machine.SpawnParams{MaxRetries: 2,
			RetryBackoffBase: 20 * time.Millisecond, RetryBackoffCap: 40 * time.Millisecond}},
		{name: "once", kind: "once", value: map[string]any{"work_ms": 100},
			params: machine.SpawnParams{AbandonOnRestart: true}},
	}
	if in.Awaits {
		children = append(children,
			childSpec{name: "agent", kind: agentKind},
			childSpec{name: "waiter", kind: waiterKind, value: map[string]any{"timeout_ms": 1000 + (in.I*157)%2000}})
	}
	for i := range children[:3] {
		children[i].params.ConcurrencyKey = in.ToolKey
	}
	return children
}

// tasksPerTurn is how many tasks one turn's tree has, leaves apart.
func tasksPerTurn(awaits bool) int {
	if awaits {
		return 13
	}
	return 11
}

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

// Worker runs the workload's handlers in one runner (a process of
// internal/chaos's, or a Runner in internal/failover's test process). logs
// is its own pool for the run log and the side effects: the outside
// world's record, which reaches the database directly even when arbor's
// pool is cut off.
type Worker struct {
	logs   *pgxpool.Pool
	schema string
	node   string
	engine *tasks.Engine
	// pending counts the statements of the record on their way (start).
	pending sync.WaitGroup
}

// NewWorker returns the worker of the runner node: engine is the runner's
// engine on schema, logs the pool that the run log and the side effects
// go to (see Worker).
func NewWorker(logs *pgxpool.Pool, schema, node string, engine *tasks.Engine) *Worker {
	return &Worker{logs: logs, schema: schema, node: node, engine: engine}
}

// Handlers returns the workload's handlers, each wrapped so that its calls
// and side effects are logged, for machine.NewRunner.
func (w *Worker) Handlers() map[string]machine.Handler {
	return map[string]machine.Handler{
		turnKind:     w.handler(false, w.turn),
		"tool":       w.handler(false, w.tool),
		stubbornKind: w.handler(true, w.tool),
		"group":      w.handler(false, w.group),
		"sibling":    w.handler(false, w.sibling),
		"doomed":     w.handler(false, w.doomed),
		"nap":        w.handler(false, w.nap),
		"flaky":      w.handler(false, w.flaky),
		"once":       w.handler(false, w.once),
		leafKind:     w.handler(false, w.leaf),
		agentKind:    w.handler(false, w.agent),
		waiterKind:   w.handler(false, w.waiter),
		DoneKind:     w.handler(false, w.done),
	}
}

// Wait waits until every statement of the record on its way has landed
// (or given up: Worker.log): call it once the runner stopped, before the
// run log is read or its pool closed.
func (w *Worker) Wait() { w.pending.Wait() }

func (w *Worker) stamp(run *machine.Run, value any) json.RawMessage {
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

// call is one call of a handler: one run_log row.
type call struct {
	w        *Worker
	id       int64
	run      *machine.Run
	stubborn bool
	refused  int

	mu          sync.Mutex
	returned    bool
	cancelledAt time.Time
	noted       chan struct{} // closed once cancelled ran
}

// Statements of the run log and the side effects. Their times are the
// clock's at the moment they stand for (see requireOneClock), passed in:
// the statement may arrive late.
const (
	logEntrySQL = `INSERT INTO %s.run_log (id, task_id, conversation_id, token, node, kind, stubborn, attempt, started_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING`
	logReturnSQL = `UPDATE %s.run_log SET returned_at = $2, cancelled_at = $3, cause = nullif($4, ''), outcome = $5, refused = $6
		WHERE id = $1`
	logEffectSQL = `INSERT INTO %s.side_effects (id, call_id, task_id, node, what, stubborn, checked_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING`
)

// handler wraps a handler of the workload: the call's entry, its return
// and the cancellation of its context are logged (see the run log).
//
// The entry is logged before the body runs, so that a call has a row
// before it does anything; a call whose entry cannot be logged (the
// database unreachable for two minutes) returns arbortype.ErrUnavailable having
// done nothing, and the runner calls it again. A well-behaved call whose
// context is cancelled while its entry is on its way returns the cause
// without running its body (see await). The return is logged before the
// wrapper returns, so that a process killed right after a return does not
// lose it — but for a call whose entry is still on its way, whose return
// follows it in the background; the time logged is taken before that
// statement.
func (w *Worker) handler(stubborn bool, body func(ctx context.Context, c *call) error) machine.Handler {
	return func(ctx context.Context, run *machine.Run) (err error) {
		entered := time.Now()
		c := &call{w: w, id: rand.Int64(), run: run, stubborn: stubborn, noted: make(chan struct{})}
		stop := context.AfterFunc(ctx, c.cancelled)
		t := run.Task
		entry := w.start(nil, func(ctx context.Context, db *pgxpool.Pool) error {
			_, err := db.Exec(ctx, fmt.Sprintf(logEntrySQL, w.schema), c.id, t.ID, t.ConversationID, t.Token, w.node, t.Kind,
				stubborn, t.Attempt, entered)
			return err
		})
		landed, lerr := c.await(ctx, entry)
		if landed && lerr != nil {
			stop()
			return fmt.Errorf("run_log: %w: %w", arbortype.ErrUnavailable, lerr)
		}
		panicked := true
		defer func() {
			returned := time.Now()
			if !stop() && ctx.Err() != nil {
				// Cancelled before the return: the AfterFunc has started, in
				// a goroutine of its own; its reading is the cancel's time.
				<-c.noted
			}
			c.mu.Lock()
			c.returned = true
			cancelledAt := c.cancelledAt
			c.mu.Unlock()
			var cancelled *time.Time
			var cause string
			if !cancelledAt.IsZero() {
				// A reading taken just after the return is the return's.
				if cancelledAt.After(returned) {
					cancelledAt = returned
				}
				cancelled, cause = &cancelledAt, context.Cause(ctx).Error()
			}
			out := "ok"
			switch {
			case panicked:
				out = "panic"
			case refusedErr(err):
				out = "refused: " + err.Error()
			case err != nil:
				out = "error: " + err.Error()
			}
			ret := w.start(entry, func(ctx context.Context, db *pgxpool.Pool) error {
				_, err := db.Exec(ctx, fmt.Sprintf(logReturnSQL, w.schema), c.id, returned, cancelled, cause, out, c.refused)
				return err
			})
			if !landed {
				return // after the entry, in the background
			}
			<-ret.done
			if ret.err != nil && err == nil && !panicked {
				err = fmt.Errorf("run_log: %w: %w", arbortype.ErrUnavailable, ret.err)
			}
		}()
		if !landed {
			// Cancelled while its entry was on its way: the body never ran.
			panicked = false
			return lerr
		}
		err = body(ctx, c)
		panicked = false
		return err
	}
}

// cancelled records when the call's context was cancelled (run by
// context.AfterFunc; a cancellation after the return is not the call's).
func (c *call) cancelled() {
	at := time.Now()
	c.mu.Lock()
	if !c.returned {
		c.cancelledAt = at
	}
	c.mu.Unlock()
	close(c.noted)
}

// note counts a write of the call that arbor refused (the run is over) and
// returns err.
func (c *call) note(err error) error {
	if refusedErr(err) {
		c.refused++
	}
	return err
}

// effect records a side effect of the call before it happens. A
// well-behaved call first checks its context, and does nothing once it is
// cancelled; checked_at is the moment it found it not cancelled. A
// stubborn call does not check.
func (c *call) effect(ctx context.Context, what string) error {
	if !c.stubborn && ctx.Err() != nil {
		return context.Cause(ctx)
	}
	checked := time.Now()
	id := rand.Int64()
	landed, err := c.await(ctx, c.w.start(nil, func(ctx context.Context, db *pgxpool.Pool) error {
		_, err := db.Exec(ctx, fmt.Sprintf(logEffectSQL, c.w.schema), id, c.id, c.run.Task.ID, c.w.node, what, c.stubborn, checked)
		return err
	}))
	switch {
	case !landed:
		return err // cancelled while its record was on its way; the effect was decided at checked
	case err != nil:
		return fmt.Errorf("side_effects: %w: %w", arbortype.ErrUnavailable, err)
	}
	return nil
}

// write is a statement of the run log or the side effects on its way
// (Worker.start); err is its result once done is closed.
type write struct {
	done chan struct{}
	err  error
}

// start runs a statement of the run log or the side effects (w.log) in
// the background, once after (if not nil) is done, counted in w.pending so
// that the runner's end waits until it has landed (Worker.Wait).
func (w *Worker) start(after *write, fn func(ctx context.Context, db *pgxpool.Pool) error) *write {
	wr := &write{done: make(chan struct{})}
	w.pending.Add(1)
	go func() {
		defer w.pending.Done()
		if after != nil {
			<-after.done
		}
		wr.err = w.log(fn)
		close(wr.done)
	}()
	return wr
}

// await waits for a statement of the call's record to land (landed, with
// its error). A well-behaved call waits only until its context is
// cancelled, and then returns its cause with landed false, the statement
// going on in the background with the times the call took: the record is
// the test's, not the handler's work, and a server restart holds it for
// seconds. Waiting it out held a call past its cancel, past the lease, and
// a CI run saw another node's call of its task begin before it returned. A
// stubborn call waits, as it ignores its context everywhere.
func (c *call) await(ctx context.Context, wr *write) (landed bool, err error) {
	if !c.stubborn {
		select {
		case <-wr.done:
		case <-ctx.Done():
			select {
			case <-wr.done:
			default:
				return false, context.Cause(ctx)
			}
		}
	}
	<-wr.done
	return true, wr.err
}

func refusedErr(err error) bool {
	return errors.Is(err, arbortype.ErrLeaseLost) || errors.Is(err, arbortype.ErrNotRunning) || errors.Is(err, arbortype.ErrAborted)
}

// log runs a statement of the run log or the side effects, again after
// each error (a terminated connection, a restarting server) for up to two
// minutes. The statements are idempotent: a try whose commit was lost and
// that is made again changes nothing more.
func (w *Worker) log(fn func(ctx context.Context, db *pgxpool.Pool) error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := fn(ctx, w.logs)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
	}
}

// work spends d in steps of stepFor, each a side effect recorded before
// it happens, heartbeating after each. A well-behaved call returns as soon
// as its context is cancelled, and returns a refused heartbeat; a stubborn
// one sleeps through its steps and goes on after a refusal.
func (c *call) work(ctx context.Context, d time.Duration) error {
	for i := range int(d / stepFor) {
		if err := c.effect(ctx, fmt.Sprint("step ", i)); err != nil {
			return err
		}
		if c.stubborn {
			time.Sleep(stepFor)
			_ = c.note(c.run.Heartbeat(ctx))
			continue
		}
		step := time.NewTimer(stepFor)
		select {
		case <-ctx.Done():
			step.Stop()
			return context.Cause(ctx)
		case <-step.C:
		}
		if err := c.note(c.run.Heartbeat(ctx)); err != nil {
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

func (w *Worker) turn(ctx context.Context, c *call) error {
	run := c.run
	in := input[turnInput](run)
	if run.Task.Phase == "gathering" {
		waited, err := run.Waited(ctx)
		if err != nil {
			return c.note(err)
		}
		outs := map[string]outcome{}
		leaves := 0
		for _, t := range waited {
			if t.Kind == leafKind {
				if t.Status == arbortype.StatusCompleted {
					leaves++
				}
				continue
			}
			outs[nameOf(t)] = outcome{Status: t.Status, Value: valueOf(t.Result)}
		}
		if in.Fan > 0 {
			outs["leaves"] = outcome{Status: arbortype.StatusCompleted, Value: json.RawMessage(fmt.Sprint(leaves))}
		}
		return c.note(run.Complete(ctx, w.stamp(run, outs)))
	}
	var ps []machine.SpawnParams
	for _, ch := range turnChildren(in) {
		value := map[string]any{"name": ch.name}
		for k, v := range ch.value {
			value[k] = v
		}
		p := ch.params
		p.Kind, p.Input = ch.kind, w.stamp(run, value)
		// A key of the turn's own: a turn run again after a crash finds the
		// children its first run spawned.
		p.IdempotencyKey = fmt.Sprintf("%d/%s", run.Task.ID, ch.name)
		ps = append(ps, p)
	}
	for i := range in.Fan {
		name := fmt.Sprintf("leaf%03d", i)
		ps = append(ps, machine.SpawnParams{Kind: leafKind, Input: w.stamp(run, map[string]any{"name": name}),
			IdempotencyKey: fmt.Sprintf("%d/%s", run.Task.ID, name), AbandonOnRestart: in.OnceLeaves})
	}
	var ids []int64
	if in.Fan == 0 {
		// One spawn at a time, each its own outcome in the runner's batch.
		for _, p := range ps {
			child, err := run.Spawn(ctx, p)
			if err != nil {
				return c.note(err)
			}
			ids = append(ids, child.ID)
		}
	} else {
		kids, err := run.SpawnMany(ctx, ps)
		if err != nil {
			return c.note(err)
		}
		for _, k := range kids {
			ids = append(ids, k.ID)
		}
	}
	return c.note(run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled,
		Phase: "gathering", State: w.stamp(run, nil)}))
}

// tool is "tool" and, ignoring its context, "stubborn".
func (w *Worker) tool(ctx context.Context, c *call) error {
	run := c.run
	in := input[struct {
		Name   string `json:"name"`
		WorkMS int    `json:"work_ms"`
	}](run)
	if err := c.work(ctx, time.Duration(in.WorkMS)*time.Millisecond); err != nil && !c.stubborn {
		return err
	}
	if err := c.note(run.Checkpoint(ctx, "worked", w.stamp(run, map[string]any{"work_ms": in.WorkMS}))); err != nil && !c.stubborn {
		return err
	}
	return c.note(run.Complete(ctx, w.stamp(run, map[string]any{"tool": in.Name})))
}

func (w *Worker) group(ctx context.Context, c *call) error {
	run := c.run
	if run.Task.Phase == "deciding" {
		waited, err := run.Waited(ctx)
		if err != nil {
			return c.note(err)
		}
		v := struct {
			Doomed   arbortype.Status   `json:"doomed"`
			Siblings []arbortype.Status `json:"siblings"`
		}{}
		for _, t := range waited {
			if t.Kind == "doomed" {
				v.Doomed = t.Status
			} else {
				v.Siblings = append(v.Siblings, t.Status)
			}
		}
		return c.note(run.Complete(ctx, w.stamp(run, v)))
	}
	spawn := func(kind, name string, value map[string]any) (int64, error) {
		value["name"] = name
		t, err := run.Spawn(ctx, machine.SpawnParams{Kind: kind, Input: w.stamp(run, value),
			IdempotencyKey: fmt.Sprintf("%d/%s", run.Task.ID, name)})
		return t.ID, c.note(err)
	}
	var ids []int64
	for i := range 2 {
		id, err := spawn("sibling", fmt.Sprint("sibling", i), map[string]any{})
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	doomed, err := spawn("doomed", "doomed", map[string]any{"siblings": ids})
	if err != nil {
		return err
	}
	return c.note(run.Wait(ctx, machine.WaitParams{ChildIDs: append(ids, doomed), Policy: arbortype.FailFast,
		Phase: "deciding", State: w.stamp(run, nil)}))
}

func (w *Worker) sibling(ctx context.Context, c *call) error {
	run := c.run
	if run.Task.Phase == "parked" { // never: the group's fail_fast aborts it first
		return c.note(run.Complete(ctx, w.stamp(run, map[string]any{"woke": true})))
	}
	return c.note(run.SleepUntil(ctx, time.Now().Add(siblingNap), "parked", w.stamp(run, nil)))
}

// doomed fails once both its siblings sleep, so that the fail_fast abort
// always finds them started (aborted, not orphaned).
func (w *Worker) doomed(ctx context.Context, c *call) error {
	run := c.run
	in := input[struct {
		Siblings []int64 `json:"siblings"`
	}](run)
	sibs, err := w.engine.GetMany(ctx, in.Siblings)
	if err != nil {
		return err
	}
	for _, s := range sibs {
		if s.Status != arbortype.StatusSleeping {
			return c.note(run.SleepUntil(ctx, time.Now().Add(pollFor), "", w.stamp(run, nil)))
		}
	}
	return machine.NonRetryable(fmt.Errorf(doomedMessage, run.Task.Token))
}

func (w *Worker) nap(ctx context.Context, c *call) error {
	run := c.run
	if run.Task.Phase == "woke" {
		return c.note(run.Complete(ctx, w.stamp(run, map[string]any{"slept": true})))
	}
	in := input[struct {
		NapMS int `json:"nap_ms"`
	}](run)
	return c.note(run.SleepUntil(ctx, time.Now().Add(time.Duration(in.NapMS)*time.Millisecond), "woke", w.stamp(run, nil)))
}

func (w *Worker) flaky(ctx context.Context, c *call) error {
	run := c.run
	if err := c.effect(ctx, "upstream call"); err != nil {
		return err
	}
	if run.Task.Retries == 0 {
		return fmt.Errorf(flakyMessage, run.Task.Token)
	}
	return c.note(run.Complete(ctx, w.stamp(run, map[string]any{"retries": run.Task.Retries})))
}

func (w *Worker) once(ctx context.Context, c *call) error {
	run := c.run
	in := input[struct {
		WorkMS int `json:"work_ms"`
	}](run)
	if err := c.work(ctx, time.Duration(in.WorkMS)*time.Millisecond); err != nil {
		return err
	}
	return c.note(run.Complete(ctx, w.stamp(run, map[string]any{"once": true})))
}

func (w *Worker) leaf(ctx context.Context, c *call) error {
	if err := c.effect(ctx, "leaf"); err != nil {
		return err
	}
	return c.note(c.run.Complete(ctx, w.stamp(c.run, map[string]any{"leaf": nameOf(c.run.Task)})))
}

// agent is a sub-agent's turn at the model: a reservation of the
// conversation's budget before the call, the call (a side effect), the
// record of what it cost, then an await of the user's approval; it
// completes with the approval's answer.
func (w *Worker) agent(ctx context.Context, c *call) error {
	run := c.run
	if run.Task.Phase == "approved" {
		var answer struct {
			Answer string `json:"answer"`
		}
		if d := run.Task.Delivered; d == nil || d.TimedOut || json.Unmarshal(d.Payload, &answer) != nil {
			return machine.NonRetryable(fmt.Errorf("agent: woken without the approval: %+v (token %d)", run.Task.Delivered, run.Task.Token))
		}
		return c.note(run.Complete(ctx, w.stamp(run, map[string]any{"approved": answer.Answer})))
	}
	res, err := run.Reserve(ctx, tokenCounter, reserveFor)
	if err != nil {
		return c.note(err)
	}
	if err := c.effect(ctx, "model call"); err != nil {
		return err
	}
	if err := c.note(run.Record(ctx, res, recordFor)); err != nil {
		return err
	}
	return c.note(run.AwaitEvent(ctx, machine.AwaitParams{Name: approveEvent, Phase: "approved", State: w.stamp(run, nil)}))
}

// waiter awaits an event nobody emits, until its timeout.
func (w *Worker) waiter(ctx context.Context, c *call) error {
	run := c.run
	if run.Task.Phase == "timedout" {
		if d := run.Task.Delivered; d == nil || !d.TimedOut {
			return machine.NonRetryable(fmt.Errorf("waiter: woken by something else than its timeout: %+v (token %d)", run.Task.Delivered, run.Task.Token))
		}
		return c.note(run.Complete(ctx, w.stamp(run, map[string]any{"timed_out": true})))
	}
	in := input[struct {
		TimeoutMS int `json:"timeout_ms"`
	}](run)
	return c.note(run.AwaitEvent(ctx, machine.AwaitParams{Name: "never", Timeout: time.Duration(in.TimeoutMS) * time.Millisecond,
		Phase: "timedout", State: w.stamp(run, nil)}))
}

// done completes at once.
func (w *Worker) done(ctx context.Context, c *call) error {
	return c.note(c.run.Complete(ctx, w.stamp(c.run, map[string]any{"done": true})))
}
