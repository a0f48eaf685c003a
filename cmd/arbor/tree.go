package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/tasks"
)

// renderTree draws a conversation's tasks as a tree, one task a line: id,
// kind, status, phase, attempt and age, what a waiting task waits on, and a
// mark on background tasks.
func renderTree(w io.Writer, conv string, all []tasks.Task, now time.Time) {
	fmt.Fprintf(w, "conversation %s\n", conv)
	children := map[int64][]tasks.Task{}
	var roots []tasks.Task
	for _, t := range all {
		if t.OwnerID == 0 {
			roots = append(roots, t)
		} else {
			children[t.OwnerID] = append(children[t.OwnerID], t)
		}
	}
	var walk func(t tasks.Task, prefix string, last bool)
	walk = func(t tasks.Task, prefix string, last bool) {
		branch, next := "├── ", "│   "
		if last {
			branch, next = "└── ", "    "
		}
		fmt.Fprintf(w, "%s%s%s\n", prefix, branch, describe(t, now))
		kids := children[t.ID]
		for i, c := range kids {
			walk(c, prefix+next, i == len(kids)-1)
		}
	}
	for i, r := range roots {
		walk(r, "", i == len(roots)-1)
	}
}

func describe(t tasks.Task, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s [%s]", t.ID, t.Kind, t.Status)
	if t.Phase != "" {
		fmt.Fprintf(&b, " phase=%s", t.Phase)
	}
	fmt.Fprintf(&b, " attempt=%d", t.Attempt)
	if age := now.Sub(t.CreatedAt); age >= 0 {
		fmt.Fprintf(&b, " age=%s", age.Round(time.Millisecond))
	}
	if t.Status == fsm.Waiting {
		fmt.Fprintf(&b, " waits(%s)=%v", t.WaitPolicy, t.WaitIDs)
	}
	if t.Background {
		b.WriteString(" (background)")
	}
	if t.Error != nil && t.Status.Settled() {
		fmt.Fprintf(&b, " error=%q", t.Error.Message)
	}
	return b.String()
}
