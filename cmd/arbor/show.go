package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

const showHelp = `Usage: arbor show TASK [flags]

Shows everything arbor records about one task: its conversation (and its
tenant, unless the default one) and owner, status, phase, attempt against
restart_limit, retries, its priority, concurrency key and queue expiry
(each when set), its wait or wake time, the run that holds it (fencing
token and lease deadline) and the machine that holds its conversation, its
timestamps, its input, state, result and error, and its children.

A task that failed more than once (retries) also shows its error history:
every failed try, newest last, up to the engine's ErrorHistoryLimit.

--json prints {"task": ..., "owner": ..., "children": [...],
"conversation": ...}: the task, its owner (left out for a root) and its
children with every column, as tree --json prints tasks, and the
conversation's holder and lease.

Example:
  arbor show 42
  arbor show 42 --json | jq .task.state
`

// showDoc is what show --json prints: the task, its owner and its
// children as rows of the same shape as tree --json's, side by side.
type showDoc struct {
	Task  taskJSON  `json:"task"`
	Owner *taskJSON `json:"owner,omitempty"`
	// Children are the task's children in id order; [] when none.
	Children     []taskJSON       `json:"children"`
	Conversation conversationJSON `json:"conversation"`
}

type conversationJSON struct {
	ID string `json:"id"`
	// Tenant is the conversation's tenant; "" the default one.
	Tenant string `json:"tenant"`
	// Holder is the machine holding the conversation's lease; "" when none.
	Holder         string    `json:"holder"`
	Epoch          int64     `json:"epoch"`
	LeaseExpiresAt *jsonTime `json:"lease_expires_at,omitempty"`
}

func cmdShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("show", showHelp, stderr)
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	id, err := parseTaskArg(fs, args)
	if err != nil {
		return err
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()

	t, err := engine.Get(ctx, id)
	if err != nil {
		return taskErr("show", id, err)
	}
	children, err := engine.Children(ctx, id)
	if err != nil {
		return taskErr("show", id, err)
	}
	var owner *arbortype.Task
	if t.OwnerID != 0 {
		o, err := engine.Get(ctx, t.OwnerID)
		if err != nil {
			return taskErr("show", t.OwnerID, err)
		}
		owner = &o
	}
	conv, err := requireConversation(ctx, engine, t.ConversationID)
	if err != nil {
		return err
	}

	budgets, err := engine.Budgets(ctx, t.ConversationID)
	if err != nil {
		return taskErr("show", id, err)
	}
	if *asJSON {
		doc := showDoc{Task: toJSON(t), Conversation: conversationJSON{
			ID: conv.ID, Tenant: conv.Tenant, Holder: conv.Holder, Epoch: conv.Epoch, LeaseExpiresAt: (*jsonTime)(conv.LeaseExpiresAt)}}
		doc.Children = make([]taskJSON, 0, len(children))
		for _, c := range children {
			doc.Children = append(doc.Children, toJSON(c))
		}
		if owner != nil {
			o := toJSON(*owner)
			doc.Owner = &o
		}
		return writeJSON(stdout, doc, false)
	}
	return renderShow(stdout, t, owner, children, conv, budgets, time.Now())
}

func renderShow(w io.Writer, t arbortype.Task, owner *arbortype.Task, children []arbortype.Task, conv arbortype.Conversation,
	budgets arbortype.ConversationBudgets, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// Each row is escaped whole: its values are the task's data.
	row := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t%s\n", k, printable(fmt.Sprintf(format, args...)))
	}

	fmt.Fprintf(tw, "task #%d %s\n", t.ID, printable(t.Kind))
	row("conversation", "%s", t.ConversationID)
	if t.Tenant != "" {
		row("tenant", "%s", t.Tenant)
	}
	if owner != nil {
		row("owner", "#%d %s [%s]", owner.ID, owner.Kind, owner.Status)
	} else {
		row("owner", "none (a root task)")
	}
	status := string(t.Status)
	if t.AbortRequested {
		status += " (abort requested)"
	}
	row("status", "%s", status)
	row("background", "%s", yesNo(t.Background))
	row("phase", "%s", orDash(t.Phase))
	if t.RerunOf != 0 {
		row("rerun of", "#%d (run again from its checkpoint)", t.RerunOf)
	}
	row("attempt", "%d of restart_limit %d", t.Attempt, t.RestartLimit)
	row("retries", "%d of max_retries %d", t.Retries, t.MaxRetries)
	row("abandon_on_restart", "%s", yesNo(t.AbandonOnRestart))
	if t.Priority != 0 {
		row("priority", "%d", t.Priority)
	}
	if t.ConcurrencyKey != "" {
		row("concurrency key", "%s", t.ConcurrencyKey)
	}
	if t.QueueExpiresAt != nil {
		row("queue expires", "%s", formatTime(t.QueueExpiresAt))
	}
	switch {
	case t.WaitPolicy != "" && t.Status == arbortype.StatusWaiting:
		row("wait", "%s on %s", t.WaitPolicy, idList(t.WaitIDs))
	case t.WaitPolicy != "":
		row("wait", "none (its last wait: %s on %s)", t.WaitPolicy, idList(t.WaitIDs))
	default:
		row("wait", "none")
	}
	row("wake at", "%s", formatTime(t.WakeAt))
	switch {
	case t.AwaitName != "" && t.Status == arbortype.StatusSleeping:
		row("await", "%s (token %s)", t.AwaitName, t.AwaitToken)
	case t.AwaitName != "":
		row("await", "none (its last await: %s)", t.AwaitName)
	}
	if d := t.Delivered; d != nil {
		if d.TimedOut {
			row("delivered", "%s: timed out", d.Name)
		} else {
			row("delivered", "%s: event %d, %s", d.Name, d.EventID, orDash(string(d.Payload)))
		}
	}
	if t.Deadline != nil {
		row("deadline", "%s", formatTime(t.Deadline))
	}
	if t.Token != 0 {
		row("run", "token %d, lease deadline %s", t.Token, formatTime(t.LeaseExpiresAt))
	} else {
		row("run", "none (not running)")
	}
	if conv.Holder != "" {
		state := "held"
		if conv.LeaseExpiresAt != nil && conv.LeaseExpiresAt.Before(now) {
			state = "expired"
		}
		row("holder", "%s (epoch %d, lease until %s, %s)", conv.Holder, conv.Epoch, formatTime(conv.LeaseExpiresAt), state)
	} else {
		row("holder", "none: no machine holds the conversation")
	}
	for _, b := range budgets.Budgets {
		if b.TaskID == t.ID {
			row("budget "+b.Counter, "%s", budgetText(b))
		}
	}
	for _, sp := range budgets.Spend {
		if sp.TaskID == t.ID {
			row("spent "+sp.Counter, "%s", spendText(sp))
		}
	}
	row("idempotency key", "%s", orDash(t.IdempotencyKey))
	row("created", "%s", formatTime(&t.CreatedAt))
	row("started", "%s", formatTime(t.StartedAt))
	row("updated", "%s", formatTime(&t.UpdatedAt))
	row("settled", "%s", formatTime(t.SettledAt))
	if err := tw.Flush(); err != nil {
		return err
	}

	doc := func(name string, raw json.RawMessage) {
		if len(raw) == 0 {
			fmt.Fprintf(w, "%s: -\n", name)
			return
		}
		// Indented JSON has newlines only between its tokens: they stay,
		// and each line is escaped.
		var buf bytes.Buffer
		var text string
		if json.Indent(&buf, raw, "", "  ") == nil {
			text = printableLines(buf.String(), "\n  ")
		} else {
			text = printable(string(raw))
		}
		fmt.Fprintf(w, "%s:\n  %s\n", name, text)
	}
	doc("input", t.Input)
	doc("state", t.State)
	doc("result", t.Result)
	if t.Error != nil {
		fmt.Fprintln(w, "error:")
		if t.Error.Code != "" {
			fmt.Fprintf(w, "  code: %s\n", printable(t.Error.Code))
		}
		fmt.Fprintf(w, "  message: %s\n", printableLines(t.Error.Message, "\n    "))
		if len(t.Error.Detail) > 0 {
			doc("  detail", t.Error.Detail)
		}
	} else {
		fmt.Fprintln(w, "error: -")
	}
	if len(t.ErrorHistory) > 1 {
		fmt.Fprintf(w, "error history (%d tries):\n", len(t.ErrorHistory))
		for _, f := range t.ErrorHistory {
			code := ""
			if f.Code != "" {
				code = " [" + printable(f.Code) + "]"
			}
			fmt.Fprintf(w, "  try %d at %s%s: %s\n", f.Try, formatTime(&f.At), code, printable(f.Message))
		}
	}
	if len(children) == 0 {
		fmt.Fprintln(w, "children: none")
		return nil
	}
	fmt.Fprintf(w, "children (%d):\n", len(children))
	for _, c := range children {
		line := fmt.Sprintf("  #%d %s [%s]", c.ID, printable(c.Kind), printable(string(c.Status)))
		if c.Background {
			line += " (background)"
		}
		fmt.Fprintln(w, line)
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
