package core

import (
	"fmt"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// sleepViolations is invariant 5 (and the retry bound) over one
// conversation's tasks and live wake jobs; Check reports them too.
//
// An await is a sleep: with a timeout it has a wake time and one live wake
// job, as a sleep has; without one it has neither. Either way it has an
// await token, and no undelivered event it would take (of its name,
// addressed to it or to its conversation) waits beside it: an emit delivers
// to a parked await, and an await takes a waiting event before it parks.
func sleepViolations(conv string, ts []Task, jobs []store.WakeJob, undelivered []store.Event) []Violation {
	type sleep struct{ task, seq int64 }
	jobsOf := map[sleep][]store.WakeJob{}
	for _, j := range jobs {
		k := sleep{j.TaskID, j.SleepSeq}
		jobsOf[k] = append(jobsOf[k], j)
	}
	byID := make(map[int64]Task, len(ts))
	var out []Violation
	add := func(inv int, id int64, msg string) {
		out = append(out, Violation{Invariant: inv, ConversationID: conv, TaskID: id, Message: msg})
	}
	for _, t := range ts {
		byID[t.ID] = t
		if t.Retries > t.MaxRetries {
			add(0, t.ID, fmt.Sprintf("task %d was retried %d times, over its max_retries %d", t.ID, t.Retries, t.MaxRetries))
		}
		if t.Status != arbortype.StatusSleeping {
			continue
		}
		if t.AwaitName != "" {
			if t.AwaitToken == "" {
				add(5, t.ID, fmt.Sprintf("task %d awaits %q without an await token", t.ID, t.AwaitName))
			}
			for _, ev := range undelivered {
				if ev.Name == t.AwaitName && (ev.TaskID == 0 || ev.TaskID == t.ID) {
					add(5, t.ID, fmt.Sprintf("task %d awaits %q while event %d of that name waits undelivered", t.ID, t.AwaitName, ev.ID))
				}
			}
			if t.WakeAt == nil {
				if live := jobsOf[sleep{t.ID, t.SleepSeq}]; len(live) > 0 {
					add(5, t.ID, fmt.Sprintf("task %d awaits %q with no timeout, but has %d live wake jobs", t.ID, t.AwaitName, len(live)))
				}
				continue
			}
		}
		if t.WakeAt == nil {
			add(5, t.ID, fmt.Sprintf("task %d is sleeping (sleep %d) without a wake time", t.ID, t.SleepSeq))
		}
		live := jobsOf[sleep{t.ID, t.SleepSeq}]
		switch {
		case len(live) == 0:
			add(5, t.ID, fmt.Sprintf("task %d is sleeping (sleep %d) without a live wake job (wake_job_id %d)", t.ID, t.SleepSeq, t.WakeJobID))
		case len(live) > 1:
			ids := make([]int64, len(live))
			for i, j := range live {
				ids[i] = j.ID
			}
			add(5, t.ID, fmt.Sprintf("task %d is sleeping (sleep %d) with %d live wake jobs %v, not one", t.ID, t.SleepSeq, len(live), ids))
		case live[0].ID != t.WakeJobID:
			add(5, t.ID, fmt.Sprintf("task %d is sleeping (sleep %d) with live wake job %d, but records wake_job_id %d", t.ID, t.SleepSeq, live[0].ID, t.WakeJobID))
		}
	}
	for _, j := range jobs {
		t, ok := byID[j.TaskID]
		switch {
		case !ok:
			add(5, j.TaskID, fmt.Sprintf("wake job %d (%s) names task %d, which is not in this conversation", j.ID, j.State, j.TaskID))
		case j.State != "running" && j.State != "available" && !(t.Status == arbortype.StatusSleeping && t.SleepSeq == j.SleepSeq):
			add(5, t.ID, fmt.Sprintf("task %d: wake job %d (%s) is left for sleep %d, but the task is %s at sleep %d",
				t.ID, j.ID, j.State, j.SleepSeq, t.Status, t.SleepSeq))
		}
	}
	return out
}
