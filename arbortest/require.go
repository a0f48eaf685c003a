package arbortest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// The Require helpers read the database now: they do not wait. After a
// Runner's work, wait first (tasks.Engine.AwaitSettled for a settle). Each
// fails the test with tb.Fatalf and a message saying what it found, and
// returns what it checked (the zero value after a failure, for a tb that
// does not stop the test).

// RequireSettled requires that task taskID settled with status (completed,
// failed, aborted, cancelled or orphaned) and, when wantResult is not nil,
// with that result, compared as JSON values (spacing and key order do not
// matter; a task with no result has the result null). It returns the task.
func RequireSettled(ctx context.Context, tb testing.TB, engine *tasks.Engine, taskID int64, status arbortype.Status, wantResult json.RawMessage) arbortype.Task {
	tb.Helper()
	if !status.Settled() {
		tb.Fatalf("arbortest.RequireSettled: %q is not a settled status (use RequireStatus for a live one)", status)
		return arbortype.Task{}
	}
	t, ok := requireStatus(ctx, tb, "RequireSettled", engine, taskID, status)
	if !ok {
		return arbortype.Task{}
	}
	if wantResult == nil {
		return t
	}
	equal, err := jsonEqual(t.Result, wantResult)
	if err != nil {
		tb.Fatalf("arbortest.RequireSettled: the wanted result of task %d: %v", taskID, err)
		return arbortype.Task{}
	}
	if !equal {
		tb.Fatalf("arbortest.RequireSettled: task %d (%s) settled %s with result %s, want %s",
			taskID, t.Kind, t.Status, orNull(t.Result), wantResult)
		return arbortype.Task{}
	}
	return t
}

// RequireStatus requires that task taskID is in status now (a live one,
// such as waiting or sleeping, or a settled one) and returns it.
func RequireStatus(ctx context.Context, tb testing.TB, engine *tasks.Engine, taskID int64, status arbortype.Status) arbortype.Task {
	tb.Helper()
	if !status.Valid() {
		tb.Fatalf("arbortest.RequireStatus: %q is not a status", status)
		return arbortype.Task{}
	}
	t, _ := requireStatus(ctx, tb, "RequireStatus", engine, taskID, status)
	return t
}

func requireStatus(ctx context.Context, tb testing.TB, name string, engine *tasks.Engine, taskID int64, status arbortype.Status) (arbortype.Task, bool) {
	tb.Helper()
	if engine == nil {
		tb.Fatalf("arbortest.%s: the engine is nil", name)
		return arbortype.Task{}, false
	}
	t, err := engine.Get(ctx, taskID)
	if err != nil {
		tb.Fatalf("arbortest.%s: %v", name, err)
		return arbortype.Task{}, false
	}
	if t.Status != status {
		tb.Fatalf("arbortest.%s: task %d (%s) is %s, want %s%s", name, taskID, t.Kind, t.Status, status, describe(t))
		return arbortype.Task{}, false
	}
	return t, true
}

// RequireChildren requires that task ownerID has exactly n children of
// kind ("" for any kind) and returns them, in id order.
func RequireChildren(ctx context.Context, tb testing.TB, engine *tasks.Engine, ownerID int64, kind string, n int) []arbortype.Task {
	tb.Helper()
	if engine == nil {
		tb.Fatalf("arbortest.RequireChildren: the engine is nil")
		return nil
	}
	all, err := engine.Children(ctx, ownerID)
	if err != nil {
		tb.Fatalf("arbortest.RequireChildren: %v", err)
		return nil
	}
	var kids []arbortype.Task
	for _, c := range all {
		if kind == "" || c.Kind == kind {
			kids = append(kids, c)
		}
	}
	if len(kids) != n {
		what := "children"
		if kind != "" {
			what = fmt.Sprintf("children of kind %q", kind)
		}
		tb.Fatalf("arbortest.RequireChildren: task %d has %d %s, want %d; its children: %s", ownerID, len(kids), what, n, list(all))
		return nil
	}
	return kids
}

// RequirePendingEvent requires that task taskID awaits the event name now
// (it is listed by tasks.Engine.PendingEvents) and returns the await, whose
// Token answers exactly it (tasks.Engine.EmitToken).
func RequirePendingEvent(ctx context.Context, tb testing.TB, engine *tasks.Engine, taskID int64, name string) arbortype.PendingEvent {
	tb.Helper()
	if engine == nil {
		tb.Fatalf("arbortest.RequirePendingEvent: the engine is nil")
		return arbortype.PendingEvent{}
	}
	t, err := engine.Get(ctx, taskID)
	if err != nil {
		tb.Fatalf("arbortest.RequirePendingEvent: %v", err)
		return arbortype.PendingEvent{}
	}
	pending, err := engine.PendingEvents(ctx, t.ConversationID)
	if err != nil {
		tb.Fatalf("arbortest.RequirePendingEvent: %v", err)
		return arbortype.PendingEvent{}
	}
	var awaits []string
	for _, p := range pending {
		if p.TaskID == taskID && p.Name == name {
			return p
		}
		awaits = append(awaits, fmt.Sprintf("#%d awaits %q", p.TaskID, p.Name))
	}
	if len(awaits) == 0 {
		awaits = append(awaits, "none")
	}
	tb.Fatalf("arbortest.RequirePendingEvent: task %d (%s, %s) does not await %q; the awaits of conversation %q: %s",
		taskID, t.Kind, t.Status, name, t.ConversationID, strings.Join(awaits, ", "))
	return arbortype.PendingEvent{}
}

// RequireConsistent runs the invariant checker (tasks.Engine.Check) over
// the conversation and requires that it finds no violation: a tree that a
// test moved on step by step is one arbor could have made.
func RequireConsistent(ctx context.Context, tb testing.TB, engine *tasks.Engine, conversationID string) {
	tb.Helper()
	if engine == nil {
		tb.Fatalf("arbortest.RequireConsistent: the engine is nil")
		return
	}
	vs, err := engine.Check(ctx, conversationID)
	if err != nil {
		tb.Fatalf("arbortest.RequireConsistent: %v", err)
		return
	}
	if len(vs) > 0 {
		msgs := make([]string, len(vs))
		for i, v := range vs {
			msgs[i] = v.Message
		}
		tb.Fatalf("arbortest.RequireConsistent: conversation %q has %d violations:\n%s", conversationID, len(vs), strings.Join(msgs, "\n"))
	}
}

// jsonEqual compares two JSON documents as values; an empty one is null.
func jsonEqual(got, want json.RawMessage) (bool, error) {
	var g, w any
	if err := json.Unmarshal(orNull(want), &w); err != nil {
		return false, fmt.Errorf("not JSON: %w", err)
	}
	if err := json.Unmarshal(orNull(got), &g); err != nil {
		return false, fmt.Errorf("the task's result is not JSON: %w", err)
	}
	return reflect.DeepEqual(g, w), nil
}

func orNull(j json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(j)) == 0 {
		return json.RawMessage("null")
	}
	return j
}

// describe says what a failure message needs about a task beyond its
// status: its error, result, phase.
func describe(t arbortype.Task) string {
	var parts []string
	if t.Error != nil {
		parts = append(parts, fmt.Sprintf("error %q", t.Error.Message))
	}
	if len(t.Result) > 0 {
		parts = append(parts, "result "+string(t.Result))
	}
	if t.Phase != "" {
		parts = append(parts, fmt.Sprintf("phase %q", t.Phase))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func list(ts []arbortype.Task) string {
	if len(ts) == 0 {
		return "none"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = fmt.Sprintf("#%d %s [%s]", t.ID, t.Kind, t.Status)
	}
	return strings.Join(s, ", ")
}
