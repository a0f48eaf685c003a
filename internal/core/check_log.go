package core

import (
	"fmt"

	"github.com/arborhq/arbor/internal/store"
)

// logViolations is invariant 11 over one conversation: the log agrees with
// its tasks. The statement that inserts a task or changes its status
// appends its status entry in the same statement (internal/store's
// logstatus.go), so a task's newest status entry names its status; one
// that names another was changed by a statement that did not log it — a
// hand-written UPDATE, since no trigger logs one. A task whose entries the
// log's retention removed is not looked at.
func logViolations(conv string, ts []Task, newest []store.LogStatus) []Violation {
	byTask := make(map[int64]store.LogStatus, len(newest))
	for _, l := range newest {
		byTask[l.TaskID] = l
	}
	var out []Violation
	for _, t := range ts {
		l, ok := byTask[t.ID]
		if !ok || l.Status == string(t.Status) {
			continue
		}
		out = append(out, Violation{Invariant: 11, ConversationID: conv, TaskID: t.ID,
			Message: fmt.Sprintf("task %d is %s, but its newest status entry in the log (seq %d) says %s: a status change was not logged", t.ID, t.Status, l.Seq, l.Status)})
	}
	return out
}
