package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

const demoHelp = `Usage: arbor demo [flags]

Runs arbor end to end against the database: migrates the schema, creates a
conversation whose turn spawns tool calls, waits on them (all_settled, then
fail_fast), completes with a background child still running, and aborts a
second turn with its whole subtree from the leaves up. It prints the tree
after every step and runs the invariant checker at the end.

Example:
  make demo          (starts a throwaway PostgreSQL for it)
  arbor demo --database-url postgres://localhost/arbor
`

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", demoHelp, stderr)
	var db dbFlags
	db.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrations.New(pool, db.schema, nil)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: db.schema})
	if err != nil {
		return err
	}
	d := &demo{ctx: ctx, e: engine, w: stdout, conv: fmt.Sprintf("demo-%d", time.Now().UnixNano())}
	return d.run()
}

type demo struct {
	ctx  context.Context
	e    *tasks.Engine
	w    io.Writer
	conv string
	err  error
}

func (d *demo) step(title string) {
	if d.err != nil {
		return
	}
	all, err := d.e.ConversationTasks(d.ctx, d.conv)
	if err != nil {
		d.err = err
		return
	}
	fmt.Fprintf(d.w, "\n== %s\n", title)
	renderTree(d.w, d.conv, all, time.Now())
}

// do runs one library call unless an earlier one failed.
func do[T any](d *demo, f func() (T, error)) T {
	var zero T
	if d.err != nil {
		return zero
	}
	v, err := f()
	if err != nil {
		d.err = err
	}
	return v
}

func (d *demo) create(owner int64, kind string, background bool) tasks.Task {
	return do(d, func() (tasks.Task, error) {
		t, _, err := d.e.Create(d.ctx, tasks.CreateParams{ConversationID: d.conv, OwnerID: owner, Kind: kind, Background: background,
			Input: json.RawMessage(fmt.Sprintf(`{"demo": %q}`, kind))})
		return t, err
	})
}

func (d *demo) start(id int64) tasks.Task {
	return do(d, func() (tasks.Task, error) { return d.e.Start(d.ctx, id) })
}

func (d *demo) complete(t tasks.Task, result string) tasks.Task {
	return do(d, func() (tasks.Task, error) { return d.e.Complete(d.ctx, t.ID, t.Token, json.RawMessage(result)) })
}

func (d *demo) run() error {
	fmt.Fprintf(d.w, "arbor demo: conversation %s\n", d.conv)

	turn := d.start(d.create(0, "chat_turn", false).ID)
	turn = do(d, func() (tasks.Task, error) {
		return d.e.Checkpoint(d.ctx, turn.ID, turn.Token, "planning", json.RawMessage(`{"plan": ["search", "docs", "approval"]}`))
	})
	search := d.create(turn.ID, "search_web", false)
	docs := d.create(turn.ID, "read_docs", false)
	approval := d.create(turn.ID, "ask_approval", false)
	summary := d.create(turn.ID, "summarize_history", true)
	d.step("a turn spawns three tool calls and a background summary")

	wait := do(d, func() (tasks.WaitResult, error) {
		return d.e.WaitForChildren(d.ctx, turn.ID, turn.Token, tasks.WaitParams{
			ChildIDs: []int64{search.ID, docs.ID, approval.ID}, Policy: tasks.AllSettled,
			Phase: "gathering", State: json.RawMessage(`{"waiting_for": 3}`)})
	})
	_ = wait
	s := d.start(search.ID)
	dc := d.start(docs.ID)
	d.start(summary.ID)
	d.complete(s, `{"hits": 3}`)
	do(d, func() (tasks.Task, error) {
		return d.e.Fail(d.ctx, dc.ID, dc.Token, tasks.TaskError{Message: "docs server returned 503"})
	})
	d.step("the turn waits (all_settled); search completed, read_docs failed")

	a := d.start(approval.ID)
	d.complete(a, `{"approved": true}`)
	d.step("the last waited child settled: the turn is woken (pending)")

	turn = d.start(turn.ID)
	retry := d.create(turn.ID, "read_docs_mirror", false)
	flaky := d.create(turn.ID, "call_flaky_api", false)
	d.start(retry.ID)
	fl := d.start(flaky.ID)
	do(d, func() (tasks.WaitResult, error) {
		return d.e.WaitForChildren(d.ctx, turn.ID, turn.Token, tasks.WaitParams{
			ChildIDs: []int64{retry.ID, flaky.ID}, Policy: tasks.FailFast, Phase: "retrying"})
	})
	do(d, func() (tasks.Task, error) {
		return d.e.Fail(d.ctx, fl.ID, fl.Token, tasks.TaskError{Message: "rate limited"})
	})
	d.step("fail_fast: call_flaky_api failed, its sibling was aborted, the turn woken")

	turn = d.start(turn.ID)
	d.complete(turn, `{"answer": "here is what I found"}`)
	d.step("the turn completed; the background summary runs on")

	turn2 := d.start(d.create(0, "chat_turn", false).ID)
	agent := d.start(d.create(turn2.ID, "sub_agent", false).ID)
	d.start(d.create(agent.ID, "browse", false).ID)
	d.create(agent.ID, "browse", false)
	d.create(turn2.ID, "web_search", false)
	d.step("a second turn with a sub-agent")

	rep := do(d, func() (tasks.AbortReport, error) { return d.e.Abort(d.ctx, turn2.ID) })
	if d.err == nil {
		fmt.Fprintf(d.w, "\n== the user pressed stop: abort settled %d tasks, leaves first:", len(rep.Settled))
		for _, t := range rep.Settled {
			fmt.Fprintf(d.w, " #%d(%s)", t.ID, t.Status)
		}
		fmt.Fprintln(d.w)
	}
	d.step("after the abort")

	vs := do(d, func() ([]tasks.Violation, error) { return d.e.Check(d.ctx, d.conv) })
	if d.err != nil {
		return d.err
	}
	if len(vs) > 0 {
		for _, v := range vs {
			fmt.Fprintln(d.w, v)
		}
		return fmt.Errorf("the invariant checker found %d violations", len(vs))
	}
	fmt.Fprintln(d.w, "\ninvariant checker: no violations")
	return nil
}
