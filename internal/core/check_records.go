package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// futureSlack is how far past the database's clock a task's time may be
// before the checker reports it: the times are the database's own now()
// (the guard stamps created_at), so only a clock stepped back by more than
// this, or a forged row, puts one there.
const futureSlack = time.Minute

// maxLease is the longest a holder's lease may run past now: the guard
// refuses a deadline further off (guardrules.RecordRules), and a
// runner's ConversationLease is at most a day.
const maxLease = 24 * time.Hour

// recordViolations checks what the guards of the schema baseline keep
// true of the rows beside a conversation's tasks, and of the tasks'
// records: what a row written with the triggers off (a superuser's
// session_replication_role, a restore) can leave wrong where the other
// invariants do not look.
//
//   - 1: a task's times, and its conversation's birth, are not in the
//     future; a settle number is positive; a fork's copy (forked_from) is
//     settled.
//   - 8: the conversation's holder is a row of the holders table of that
//     name (holder and holder_id set together), whose lease runs at most a
//     day past the database's clock (a deadline further off would hold
//     the conversation from every other node for that long).
//   - 11: every event is in the log (an emit wrote it), names only tasks
//     of its conversation, and was delivered at most once — to its
//     addressee if it has one, after it was emitted, to a task the log
//     shows parked awaiting its name; a task woken by an event names one
//     delivered to it, with the payload emitted; a task parked in an
//     await carries no delivery.
//   - 12: every log entry that names a task names one of its conversation,
//     none is stamped in the future, every event entry is an emit's (the
//     event it names has its name, task and payload), every progress
//     entry a run's (it names a task whose newest status entry before it
//     is running), and each task's newest status entry is its status
//     (every status change is logged).
//
// The log's retention (Config.LogRetention) deletes entries older than
// kept: what the log must show is asked only of tasks created and events
// emitted since, whose entries the retention has not reached.
func recordViolations(conv string, all []Task, byID map[int64]*Task, r store.Records, kept time.Time) []Violation {
	var out []Violation
	add := func(inv int, id int64, format string, args ...any) {
		out = append(out, Violation{Invariant: inv, ConversationID: conv, TaskID: id, Message: fmt.Sprintf(format, args...)})
	}

	// 8. the holder.
	switch {
	case (r.Holder == "") != (r.HolderID == 0):
		add(8, 0, "the conversation names holder %q with holder row %d: the two go together", r.Holder, r.HolderID)
	case r.HolderID != 0 && r.HolderRow == nil:
		add(8, 0, "the conversation's holder row %d (%q) does not exist", r.HolderID, r.Holder)
	case r.HolderID != 0 && *r.HolderRow != r.Holder:
		add(8, 0, "the conversation names holder %q, but its holder row %d is %q", r.Holder, r.HolderID, *r.HolderRow)
	case r.HolderExpires != nil && r.HolderExpires.After(r.Now.Add(maxLease+futureSlack)):
		add(8, 0, "the conversation's holder row %d (%q) holds its lease until %s, more than a day past the database's clock (%s): a lease is at most a day",
			r.HolderID, r.Holder, r.HolderExpires.UTC().Format(time.RFC3339), r.Now.UTC().Format(time.RFC3339))
	}

	// 1. times, settle numbers, fork copies.
	limit := r.Now.Add(futureSlack)
	if r.Created.After(limit) {
		add(1, 0, "the conversation's created_at %s is after the database's clock (%s)", r.Created.UTC().Format(time.RFC3339), r.Now.UTC().Format(time.RFC3339))
	}
	for i := range all {
		t := &all[i]
		for _, at := range []struct {
			name string
			t    *time.Time
		}{{"created_at", &t.CreatedAt}, {"started_at", t.StartedAt}, {"settled_at", t.SettledAt}} {
			if at.t != nil && at.t.After(limit) {
				add(1, t.ID, "%s %s is after the database's clock (%s)", at.name, at.t.UTC().Format(time.RFC3339), r.Now.UTC().Format(time.RFC3339))
			}
		}
		if t.SettleSeq < 0 {
			add(1, t.ID, "settle number %d is not positive", t.SettleSeq)
		}
		// 11. a parked await has no delivery yet.
		if awaiting(*t) && t.Delivered != nil {
			add(11, t.ID, "parked awaiting %q, yet it carries a delivery (%q)", t.AwaitName, t.Delivered.Name)
		}
	}
	for _, id := range r.LiveForks {
		add(1, id, "live (%s), yet marked as a fork's copy: a fork copies settled tasks only", statusOf(byID, id))
	}

	// 12. the log.
	for _, seq := range r.FutureLog {
		add(12, 0, "log entry %d is stamped after the database's clock (%s)", seq, r.Now.UTC().Format(time.RFC3339))
	}
	for _, seq := range r.ForgedLogEvents {
		add(12, 0, "log entry %d is an event no emit wrote: it names no event id, or an event of another name, task or payload", seq)
	}
	for _, seq := range r.ForgedProgress {
		add(12, 0, "log entry %d is progress no run wrote: it names no task, or its task was not logged running before it", seq)
	}
	logged := make(map[int64]store.TaskLog, len(r.Logged))
	for _, l := range r.Logged {
		logged[l.TaskID] = l
		if byID[l.TaskID] == nil {
			add(12, l.TaskID, "the conversation's log names task %d, which is not a task of the conversation", l.TaskID)
		}
	}
	for i := range all {
		t := &all[i]
		// A task the log keeps no status entry of is not looked at: its
		// entries may be past the log's retention, or it was inserted
		// outside arbor (a restore, a test's fixture), which the guard
		// lets by only as a fresh pending task.
		switch l, ok := logged[t.ID]; {
		case !ok || l.Status == "":
		case l.Status != string(t.Status):
			add(12, t.ID, "%s, but its newest status entry in the log says %s: a status change was not logged", t.Status, l.Status)
		}
	}

	// 11. events.
	for _, id := range r.ForgedDeliveries {
		add(11, id, "woken by a delivery that names no event delivered to it as emitted")
	}
	inLog := make(map[int64]bool, len(r.LoggedEvents))
	for _, id := range r.LoggedEvents {
		inLog[id] = true
	}
	for _, ev := range r.Events {
		if !inLog[ev.ID] && !ev.EmittedAt.Before(kept) {
			add(11, ev.TaskID, "event %d (%q) is not in the log: no emit made it", ev.ID, ev.Name)
		}
		if ev.TaskID != 0 && byID[ev.TaskID] == nil {
			add(11, ev.TaskID, "event %d (%q) is addressed to task %d, which is not a task of the conversation", ev.ID, ev.Name, ev.TaskID)
		}
		if (ev.DeliveredTo == 0) != (ev.DeliveredAt == nil) {
			add(11, ev.DeliveredTo, "event %d (%q): delivered_to and delivered_at go together", ev.ID, ev.Name)
		}
		if ev.DeliveredTo == 0 {
			continue
		}
		to := byID[ev.DeliveredTo]
		switch {
		case to == nil:
			add(11, ev.DeliveredTo, "event %d (%q) was delivered to task %d, which is not a task of the conversation", ev.ID, ev.Name, ev.DeliveredTo)
		case ev.TaskID != 0 && ev.TaskID != ev.DeliveredTo:
			add(11, ev.DeliveredTo, "event %d (%q) is addressed to task %d but was delivered to task %d", ev.ID, ev.Name, ev.TaskID, ev.DeliveredTo)
		case !to.CreatedAt.Before(kept) && !slices.Contains(logged[ev.DeliveredTo].Awaited, ev.Name):
			add(11, ev.DeliveredTo, "event %d (%q) was delivered to task %d, which never awaited %q", ev.ID, ev.Name, ev.DeliveredTo, ev.Name)
		}
		if ev.DeliveredAt != nil && ev.DeliveredAt.Before(ev.EmittedAt) {
			add(11, ev.DeliveredTo, "event %d (%q) was delivered (%s) before it was emitted (%s)", ev.ID, ev.Name,
				ev.DeliveredAt.UTC().Format(time.RFC3339Nano), ev.EmittedAt.UTC().Format(time.RFC3339Nano))
		}
	}
	return out
}

// statusOf is the status of task id, for a message.
func statusOf(byID map[int64]*Task, id int64) arbortype.Status {
	if t := byID[id]; t != nil {
		return t.Status
	}
	return ""
}
