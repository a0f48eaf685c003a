package tasks

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/store"
)

// CheckSleeping verifies invariant 5 of DESIGN §4 over one conversation and
// returns its violations as human-readable lines naming the task (none: nil):
//
//   - a sleeping task has a wake time, and exactly one live wake job (one
//     River has not completed, cancelled or discarded) for its current
//     sleep, and that job is the one the task records (wake_job_id);
//   - from the other side, no wake job waiting for its time (scheduled,
//     pending or retryable) is left for a sleep that is over: wakes,
//     cancels and aborts remove it in their transaction. An available or
//     running wake job of a finished sleep is not a violation: it is one
//     River was promoting or fetching when the sleep ended (the engine
//     does not wait for River's locks, see store.DeleteWakeJobs), or the
//     worker that is waking (or just woke) the task; it finds the sleep
//     over and does nothing;
//   - a task has not been retried more often than its max_retries.
//
// Tasks and jobs are read in one repeatable-read snapshot, so the check can
// run while the conversation is busy. The error is for a failed read only.
func (e *Engine) CheckSleeping(ctx context.Context, conversationID string) ([]string, error) {
	var (
		ts   []Task
		jobs []store.WakeJob
	)
	err := pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if ts, err = e.store.ConversationTasks(ctx, tx, conversationID); err != nil {
			return err
		}
		jobs, err = e.store.LiveWakeJobs(ctx, tx, conversationID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("check sleeping tasks of conversation %q: %w", conversationID, err)
	}
	var out []string
	for _, v := range sleepViolations(conversationID, ts, jobs) {
		out = append(out, v.Message)
	}
	return out, nil
}

// sleepViolations is invariant 5 (and the retry bound) over one
// conversation's tasks and live wake jobs; Check reports them too.
func sleepViolations(conv string, ts []Task, jobs []store.WakeJob) []Violation {
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
		if t.Status != fsm.Sleeping {
			continue
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
		case j.State != "running" && j.State != "available" && !(t.Status == fsm.Sleeping && t.SleepSeq == j.SleepSeq):
			add(5, t.ID, fmt.Sprintf("task %d: wake job %d (%s) is left for sleep %d, but the task is %s at sleep %d",
				t.ID, j.ID, j.State, j.SleepSeq, t.Status, t.SleepSeq))
		}
	}
	return out
}
