package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

const treeHelp = `Usage: arbor tree CONVERSATION [flags]

Draws a conversation's task tree, one task a line: id, kind, status, phase,
attempt and age, its priority and concurrency key when set, and when a
queued task that never started expires; what a waiting task waits on (its
policy and the children it names), what a completing task still waits
for, when a sleeping task wakes, and what an awaiting one awaits
("[awaiting approval]", and when its await times out); background tasks
are marked, and a settled task's error is shown.
The first line names the conversation, and its tenant unless the default.

Tasks deeper than 24 levels are drawn at the 24th level's indentation,
each marked "… (depth N)": its owner is the nearest line above it of depth
N-1.

--json prints {"conversation": ..., "tasks": [...]}: every task of the
conversation, with every column, as a flat list in id order (owners before
their children); owner_id links a task to its owner and is null for a
root. --watch keeps redrawing until Ctrl-C: on a terminal the screen is
redrawn every --interval; otherwise a new tree (or, with --json, a new
one-line JSON document) is written each time the tree changes.

Example:
  arbor tree chat-42
  arbor tree chat-42 --watch --interval 500ms
  arbor tree chat-42 --json | jq '.tasks[] | select(.owner_id == 1) | .id'
`

func cmdTree(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tree", treeHelp, stderr)
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a drawing")
	watch := fs.Bool("watch", false, "redraw as the tree changes, until Ctrl-C")
	interval := fs.Duration("interval", time.Second, "how often --watch polls the database")
	noAge := fs.Bool("no-age", false, "leave the age column out (stable output, for diffs and tests)")
	pos, err := parseArgs(fs, args, 1, 1, "the conversation id")
	if err != nil {
		return err
	}
	if *interval < 10*time.Millisecond {
		return fmt.Errorf("tree: --interval %s is below 10ms", *interval)
	}
	conv := pos[0]
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	c, err := requireConversation(ctx, engine, conv)
	if err != nil {
		return err
	}
	draw := func(w io.Writer, compact bool) error {
		all, err := engine.ConversationTasks(ctx, conv)
		if err != nil {
			return fmt.Errorf("read conversation %q: %w", conv, err)
		}
		budgets, err := engine.Budgets(ctx, conv)
		if err != nil {
			return fmt.Errorf("read conversation %q: %w", conv, err)
		}
		if *asJSON {
			return writeJSON(w, treeJSON(conv, all), compact)
		}
		now := time.Now()
		if *noAge {
			now = time.Time{}
		}
		renderTree(w, c, all, budgets, now)
		return nil
	}
	if !*watch {
		return draw(stdout, false)
	}
	return watchTree(ctx, stdout, stderr, *interval, draw)
}

// watchTree redraws until ctx ends (Ctrl-C), which is a normal end. On a
// terminal it clears the screen and draws every interval, so that ages
// advance; otherwise it writes a frame only when it differs from the last
// one, so that a pipe or a log gets one entry per change. A failed read
// after the first is reported and retried at the next tick: a watch
// survives a database restart.
func watchTree(ctx context.Context, stdout, stderr io.Writer, interval time.Duration, draw func(io.Writer, bool) error) error {
	terminal := isTerminal(stdout)
	var last []byte
	first := true
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		var frame bytes.Buffer
		err := draw(&frame, !terminal)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && first:
			return err
		case err != nil:
			fmt.Fprintf(stderr, "arbor: %s (retrying every %s)\n", printable(err.Error()), interval)
		case terminal:
			fmt.Fprint(stdout, "\x1b[H\x1b[2J")
			stdout.Write(frame.Bytes())
			fmt.Fprintf(stdout, "\nevery %s, %s; Ctrl-C to stop\n", interval, time.Now().Format("15:04:05"))
		case !bytes.Equal(frame.Bytes(), last):
			stdout.Write(frame.Bytes())
			last = frame.Bytes()
		}
		first = false
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// treeDoc is what tree --json prints: the conversation's tasks as a flat
// list, not nested. A script reads the rows as it would query them (jq
// '.tasks[] | select(.status == "failed")'), and the document is as deep
// for a chain of 100,000 tasks as for one task; nested under their owners,
// as they once were, they made encoding/json give up near 5,000 levels.
type treeDoc struct {
	Conversation string `json:"conversation"`
	// Tasks is every task of the conversation in id order, which puts
	// every owner before its children; owner_id links them (null for a
	// root).
	Tasks []taskJSON `json:"tasks"`
}

func treeJSON(conv string, all []arbortype.Task) treeDoc {
	doc := treeDoc{Conversation: conv, Tasks: make([]taskJSON, 0, len(all))}
	for _, t := range all {
		doc.Tasks = append(doc.Tasks, toJSON(t))
	}
	return doc
}

// maxDrawnDepth is how many levels of the tree are drawn with branch
// lines; the roots are at depth 1. A deeper task is drawn at that
// indentation, with "… (depth N)" in place of its branch, so that no line
// is longer than a bounded prefix and its description, and the drawing is
// linear in the number of tasks at any depth (a 10,000-deep chain drawn
// with all its prefixes was 200 MB). Its owner is the nearest line above
// it of depth N-1.
const maxDrawnDepth = 24

// renderTree draws a conversation's tasks as a tree, one task a line: id,
// kind, status, phase, attempt and age (relative to now; a zero now leaves
// the age out, for output that does not change while nothing happens), what
// a waiting task waits on, and a mark on background tasks. It walks the
// tree with a stack of its own, not by recursion, so that no depth can
// exhaust the goroutine's stack.
func renderTree(w io.Writer, conv arbortype.Conversation, all []arbortype.Task, budgets arbortype.ConversationBudgets, now time.Time) {
	tenant := ""
	if conv.Tenant != "" {
		tenant = " tenant=" + printable(conv.Tenant)
	}
	fmt.Fprintf(w, "conversation %s%s%s\n", printable(conv.ID), tenant, budgetNotes(budgets, 0))
	children := map[int64][]arbortype.Task{}
	var roots []arbortype.Task
	for _, t := range all {
		if t.OwnerID == 0 {
			roots = append(roots, t)
		} else {
			children[t.OwnerID] = append(children[t.OwnerID], t)
		}
	}
	if len(roots) == 0 {
		fmt.Fprintln(w, "└── (no tasks)")
	}
	type pending struct {
		task  arbortype.Task
		depth int
		last  bool // the last of its siblings
	}
	// The tasks still to draw, the next on top: depth first, siblings in
	// id order.
	var stack []pending
	push := func(ts []arbortype.Task, depth int) {
		for i := len(ts) - 1; i >= 0; i-- {
			stack = append(stack, pending{task: ts[i], depth: depth, last: i == len(ts)-1})
		}
	}
	push(roots, 1)
	// rails[i] is what the lines below the current task's ancestor of depth
	// i+1 draw in its column: a rail while that ancestor has siblings still
	// to come, blanks after its last one.
	var rails []string
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		rails = rails[:min(p.depth-1, maxDrawnDepth)]
		branch, rail := "├── ", "│   "
		if p.last {
			branch, rail = "└── ", "    "
		}
		if p.depth > maxDrawnDepth {
			branch = fmt.Sprintf("… (depth %d) ", p.depth)
		}
		kids := children[p.task.ID]
		fmt.Fprintf(w, "%s%s%s%s\n", strings.Join(rails, ""), branch, describe(p.task, kids, now), budgetNotes(budgets, p.task.ID))
		if p.depth <= maxDrawnDepth {
			rails = append(rails, rail)
		}
		push(kids, p.depth+1)
	}
}

// describe is one task's line of the tree; kids are its children.
func describe(t arbortype.Task, kids []arbortype.Task, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s [%s]", t.ID, printable(t.Kind), printable(statusWord(t)))
	if t.RerunOf != 0 {
		fmt.Fprintf(&b, " rerun of #%d", t.RerunOf)
	}
	if t.Phase != "" {
		fmt.Fprintf(&b, " phase=%s", printable(t.Phase))
	}
	fmt.Fprintf(&b, " attempt=%d", t.Attempt)
	if t.MaxRetries > 0 {
		fmt.Fprintf(&b, " retries=%d/%d", t.Retries, t.MaxRetries)
	}
	if !now.IsZero() {
		fmt.Fprintf(&b, " age=%s", age(now, t.CreatedAt))
	}
	if t.Priority != 0 {
		fmt.Fprintf(&b, " priority=%d", t.Priority)
	}
	if t.ConcurrencyKey != "" {
		fmt.Fprintf(&b, " key=%s", printable(t.ConcurrencyKey))
	}
	if t.QueueExpiresAt != nil && t.Status == arbortype.StatusPending && t.StartedAt == nil {
		fmt.Fprintf(&b, " expires at %s", formatTime(t.QueueExpiresAt))
	}
	switch t.Status {
	case arbortype.StatusWaiting:
		fmt.Fprintf(&b, " waits %s on %s", printable(string(t.WaitPolicy)), idList(t.WaitIDs))
	case arbortype.StatusCompleting:
		var live []int64
		for _, c := range kids {
			if c.Status.Live() && !c.Background {
				live = append(live, c.ID)
			}
		}
		fmt.Fprintf(&b, " holds its result, waits on %s", idList(live))
	case arbortype.StatusSleeping:
		switch {
		case t.AwaitName == "":
			fmt.Fprintf(&b, " wakes at %s", formatTime(t.WakeAt))
		case t.WakeAt != nil:
			fmt.Fprintf(&b, " times out at %s", formatTime(t.WakeAt))
		}
	}
	if t.Background {
		b.WriteString(" (background)")
	}
	if t.AbortRequested && t.Status.Live() {
		b.WriteString(" (abort requested)")
	}
	if t.Error != nil && t.Status.Settled() {
		// %q escapes every rune printable does, and quotes and backslashes
		// too, so that the message's end is plain.
		fmt.Fprintf(&b, " error=%q", t.Error.Message)
	}
	return b.String()
}

// budgetNotes describes the budgets of scope (0: the conversation) and,
// for a task, what it spent itself: " budget tokens=120/1000 spent tokens=30".
func budgetNotes(budgets arbortype.ConversationBudgets, scope int64) string {
	var b strings.Builder
	for _, x := range budgets.Budgets {
		if x.TaskID == scope {
			fmt.Fprintf(&b, " budget %s=%s", printable(x.Counter), budgetText(x))
		}
	}
	if scope != 0 {
		for _, sp := range budgets.Spend {
			if sp.TaskID == scope {
				fmt.Fprintf(&b, " spent %s=%s", printable(sp.Counter), spendText(sp))
			}
		}
	}
	return b.String()
}

// budgetText is "120/1000" (with "+30 held" while reservations are open,
// and the action when it is not the default), or "120 (tally)".
func budgetText(b arbortype.Budget) string {
	if b.Max == arbortype.Unlimited {
		return fmt.Sprintf("%d%s (tally)", b.Spent, held(b.Reserved))
	}
	s := fmt.Sprintf("%d%s/%d", b.Spent, held(b.Reserved), b.Max)
	if b.Counter == arbortype.CounterWallTime {
		s += "ms"
	}
	if b.OnExhausted != arbortype.BudgetFail {
		s += " (" + string(b.OnExhausted) + ")"
	}
	return s
}

func spendText(sp arbortype.Spend) string { return fmt.Sprintf("%d%s", sp.Spent, held(sp.Reserved)) }

func held(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("+%d held", n)
}

// idList writes ids as "#2 #3 #4", or "(none)".
func idList(ids []int64) string {
	if len(ids) == 0 {
		return "(none)"
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("#%d", id)
	}
	return strings.Join(parts, " ")
}

// statusWord is a task's status as a person reads it: an await is
// "awaiting <its event>", not the sleep it is stored as.
func statusWord(t arbortype.Task) string {
	if t.Status == arbortype.StatusSleeping && t.AwaitName != "" {
		return "awaiting " + t.AwaitName
	}
	return string(t.Status)
}
