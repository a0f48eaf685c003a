package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

const demoHelp = `Usage: arbor demo [flags]

Runs arbor end to end through its runner: it migrates the schema, starts a
worker process (arbor demo-worker) and sends a conversation three turns:
  1. a turn that fans out to three tool calls (all_settled), one of which
     sleeps for a rate limit, then asks three translators at once (fail_fast:
     one fails, the others are aborted), then answers;
  2. a research turn whose sub-agent browses until the user presses stop:
     the whole subtree is aborted, leaves first;
  3. a turn whose sub-agent needs a human's approval: it parks on the event,
     and the demo grants it with the command line (arbor emit --token);
  4. a turn that streams a long answer, interrupted by a second message
     (turn policy interrupt): the first turn is aborted with its reason and
     the second answers;
  5. a long turn during which the demo kills the worker (SIGKILL) and starts
     another, which takes the conversation over once the lease expires,
     prints its reconcile report, and finishes the turn.
It prints the tree each time it changes and runs the invariant checker at
the end. It takes well under a minute.

Example:
  make demo          (starts a throwaway PostgreSQL for it)
  arbor demo --database-url postgres://localhost/arbor
`

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", demoHelp, stderr)
	var db dbFlags
	db.register(fs)
	if _, err := parseArgs(fs, args, 0, 0, ""); err != nil {
		return err
	}
	pools, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pools.Close()
	m, err := migrations.New(pools.unpooled(), db.schema, nil)
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	engine, err := tasks.New(ctx, pools.main, pools.config(&tasks.Config{Schema: db.schema}))
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	d := &demo{ctx: ctx, e: engine, out: stdout, errOut: stderr, conv: fmt.Sprintf("demo-%d", time.Now().UnixNano()),
		exe: exe, dbArgs: []string{"--database-url", db.url, "--direct-url", db.direct, "--schema", db.schema}, start: time.Now()}
	defer d.stopWorkers()
	return d.run()
}

type demo struct {
	ctx    context.Context
	e      *tasks.Engine
	out    io.Writer
	errOut io.Writer
	conv   string
	exe    string
	dbArgs []string
	start  time.Time

	mu       sync.Mutex
	lastTree string
	workers  []*exec.Cmd
}

func (d *demo) say(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fmt.Fprintf(d.out, format+"\n", args...)
}

// startWorker starts a demo-worker process and forwards its output.
func (d *demo) startWorker(node string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(d.ctx, d.exe, append([]string{"demo-worker", "--node", node}, d.dbArgs...)...)
	cmd.Stderr = d.errOut
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d.workers = append(d.workers, cmd)
	started := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			d.say("   [%s] %s", node, sc.Text())
			if first {
				first = false
				close(started)
			}
		}
		if first {
			close(started)
		}
	}()
	select {
	case <-started:
	case <-d.ctx.Done():
		return nil, d.ctx.Err()
	}
	return cmd, nil
}

func (d *demo) stopWorkers() {
	for _, w := range d.workers {
		if w.ProcessState == nil {
			_ = w.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = w.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = w.Process.Kill()
			}
		}
	}
}

// watch prints the tree whenever it changes, until stop is closed.
func (d *demo) watch(stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			d.printTreeIfChanged()
			select {
			case <-stop:
				d.printTreeIfChanged()
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return done
}

func (d *demo) printTreeIfChanged() {
	all, err := d.e.ConversationTasks(d.ctx, d.conv)
	if err != nil || len(all) == 0 {
		return
	}
	var b bytes.Buffer
	renderTree(&b, arbortype.Conversation{ID: d.conv}, all, arbortype.ConversationBudgets{}, time.Time{})
	d.mu.Lock()
	defer d.mu.Unlock()
	if b.String() == d.lastTree {
		return
	}
	d.lastTree = b.String()
	fmt.Fprintf(d.out, "-- t=%.1fs\n%s", time.Since(d.start).Seconds(), b.String())
}

// waitFor polls the conversation until cond holds.
func (d *demo) waitFor(what string, cond func(all []arbortype.Task) bool) error {
	for {
		all, err := d.e.ConversationTasks(d.ctx, d.conv)
		if err != nil {
			return err
		}
		if cond(all) {
			return nil
		}
		select {
		case <-d.ctx.Done():
			return fmt.Errorf("demo: gave up waiting for %s: %w", what, d.ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func statusOf(all []arbortype.Task, id int64) arbortype.Status {
	for _, t := range all {
		if t.ID == id {
			return t.Status
		}
	}
	return ""
}

func count(all []arbortype.Task, kind string, status arbortype.Status) int {
	n := 0
	for _, t := range all {
		if t.Kind == kind && t.Status == status {
			n++
		}
	}
	return n
}

func (d *demo) turn(mode string) (arbortype.Task, error) {
	return d.turnWith(mode, arbortype.TurnQueue)
}

func (d *demo) turnWith(mode string, policy arbortype.TurnPolicy) (arbortype.Task, error) {
	input, _ := json.Marshal(map[string]string{"mode": mode})
	t, _, err := d.e.Create(d.ctx, arbortype.CreateParams{ConversationID: d.conv, Kind: "chat_turn", Input: input, OnBusy: policy})
	return t, err
}

// follow is the client following the conversation: it prints the handlers'
// progress and every turn's settle as they commit, until ctx ends.
func (d *demo) follow(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.e.Follow(ctx, d.conv, 0, func(en arbortype.LogEntry) error {
			switch {
			case en.Kind == arbortype.LogKindProgress:
				d.say("   [client] #%d %s %s", en.TaskID, en.Name, en.Payload)
			case en.Kind == arbortype.LogKindEvent:
				d.say("   [client] event %s", en.Name)
			case en.Terminal() && en.Name == "chat_turn":
				d.say("   [client] turn #%d %s", en.TaskID, en.Status)
			}
			return nil
		})
	}()
	return done
}

// approve answers the pending approval the way a user does: with the arbor
// command line, given the await's token.
func (d *demo) approve() error {
	var pending []arbortype.PendingEvent
	for len(pending) == 0 {
		var err error
		if pending, err = d.e.PendingEvents(d.ctx, d.conv); err != nil {
			return err
		}
		if len(pending) == 0 {
			select {
			case <-d.ctx.Done():
				return fmt.Errorf("demo: gave up waiting for the approval: %w", d.ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	p := pending[0]
	d.say("\n== #%d %s awaits %q; the user approves it:\n   $ arbor emit --token %s '{\"approved\": true}'", p.TaskID, p.Kind, p.Name, p.Token)
	cmd := exec.CommandContext(d.ctx, d.exe, append([]string{"emit", "--token", p.Token, `{"approved": true}`}, d.dbArgs...)...)
	out, err := cmd.CombinedOutput()
	d.say("   %s", bytes.TrimSpace(out))
	return err
}

func (d *demo) run() error {
	d.say("arbor demo: conversation %s", d.conv)
	if _, err := d.startWorker("worker-1"); err != nil {
		return err
	}
	stop := make(chan struct{})
	watching := d.watch(stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-watching
	}()

	d.say("\n== turn 1: three tool calls at once (all_settled); rate_limited_api sleeps 1 s, then\n   three translators at once (fail_fast): translate_fr fails and its siblings are aborted")
	t1, err := d.turn("")
	if err != nil {
		return err
	}
	// The client follows the conversation from its first entry, now that
	// it exists (the log of a conversation that does not is ErrNotFound).
	followCtx, stopFollowing := context.WithCancel(d.ctx)
	following := d.follow(followCtx)
	defer func() { stopFollowing(); <-following }()
	if err := d.waitFor("turn 1 to complete", func(all []arbortype.Task) bool { return statusOf(all, t1.ID) == arbortype.StatusCompleted }); err != nil {
		return err
	}

	d.say("\n== turn 2: a sub-agent browses until the user presses stop")
	t2, err := d.turn("research")
	if err != nil {
		return err
	}
	if err := d.waitFor("the browsing to start", func(all []arbortype.Task) bool { return count(all, "browse", arbortype.StatusRunning) == 2 }); err != nil {
		return err
	}
	rep, err := d.e.Abort(d.ctx, t2.ID)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("\n== the user pressed stop: the abort settled %d tasks, leaves first:", len(rep.Settled))
	for _, t := range rep.Settled {
		line += fmt.Sprintf(" #%d %s→%s", t.ID, t.Kind, t.Status)
	}
	d.say("%s", line)

	d.say("\n== turn 3: a sub-agent needs a human's approval before it sends an email")
	t3a, err := d.turn("approval")
	if err != nil {
		return err
	}
	if err := d.approve(); err != nil {
		return err
	}
	if err := d.waitFor("turn 3 to complete", func(all []arbortype.Task) bool { return statusOf(all, t3a.ID) == arbortype.StatusCompleted }); err != nil {
		return err
	}

	d.say("\n== turn 4: a long answer streams to the client; a second message arrives mid-turn\n   (policy interrupt): the running turn is aborted and the new one answers")
	t4, err := d.turn("stream")
	if err != nil {
		return err
	}
	if err := d.waitFor("the answer to start streaming", func(all []arbortype.Task) bool { return statusOf(all, t4.ID) == arbortype.StatusRunning }); err != nil {
		return err
	}
	time.Sleep(time.Second)
	t4b, err := d.turnWith("quick", arbortype.TurnInterrupt)
	if err != nil {
		return err
	}
	if err := d.waitFor("the second message's turn to complete", func(all []arbortype.Task) bool {
		return statusOf(all, t4b.ID) == arbortype.StatusCompleted
	}); err != nil {
		return err
	}
	if got, err := d.e.Get(d.ctx, t4.ID); err == nil && got.Error != nil {
		d.say("   turn #%d: %s (%s)", got.ID, got.Status, got.Error.Message)
	}

	d.say("\n== turn 5: long steps; the worker is killed in the middle")
	t3, err := d.turn("long")
	if err != nil {
		return err
	}
	if err := d.waitFor("the long steps to run", func(all []arbortype.Task) bool { return count(all, "long_step", arbortype.StatusRunning) == 3 }); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	w1 := d.workers[0]
	_ = w1.Process.Signal(syscall.SIGKILL)
	_ = w1.Wait()
	d.say("\n== crash: worker-1 killed with SIGKILL mid-turn; worker-2 starts and takes the conversation\n   over once worker-1's lease (%s) expires", demoLease)
	if _, err := d.startWorker("worker-2"); err != nil {
		return err
	}
	if err := d.waitFor("turn 5 to complete", func(all []arbortype.Task) bool { return statusOf(all, t3.ID) == arbortype.StatusCompleted }); err != nil {
		return err
	}
	close(stop)
	<-watching

	vs, err := d.e.Check(d.ctx, d.conv)
	if err != nil {
		return err
	}
	if len(vs) > 0 {
		for _, v := range vs {
			d.say("%s", v)
		}
		return fmt.Errorf("the invariant checker found %d violations", len(vs))
	}
	d.say("\ninvariant checker: no violations; the demo took %.1fs", time.Since(d.start).Seconds())
	d.say("inspect it with: arbor tree %s", d.conv)
	return nil
}
