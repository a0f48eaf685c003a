package store

import (
	publicstore "github.com/arborhq/arbor/store"

	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Sleep, wake and retry queries (docs/design.md §3.5, §3.7), and the few reads and
// deletes of River's job table (river_job, migrated into the same schema)
// that keep a sleeping task and its wake job in step. River's own API
// inserts and completes those jobs; the engine deletes them with one
// statement of its own, for any number of tasks at once and skipping the
// rows River's scheduler holds (see DeleteWakeJobs).

// WakeJobKind is the River job kind of the jobs that wake sleeping tasks.
const WakeJobKind = publicstore.WakeJobKind

// SleepingTask is what a waker needs to arm a timer for a sleep.
type SleepingTask struct {
	TaskID         int64
	ConversationID string
	SleepSeq       int64
	WakeAt         time.Time
}

// WakeJob is a live (not finalized) wake job, as the invariant check sees it.
type WakeJob struct {
	ID       int64
	State    string
	TaskID   int64
	SleepSeq int64
}

var (
	qSleepTask      = define("SleepTask")
	qRetryTask      = define("RetryTask")
	qNotifySleep    = define("NotifySleep")
	qDueNow         = define("DueNow")
	qDeleteWakeJobs = define("DeleteWakeJobs")
	qSleepingDue    = define("SleepingDue")
	qDatabaseNow    = define("DatabaseNow")
	qTransactionNow = define("TransactionNow")
	qLiveWakeJobs   = define("LiveWakeJobs")
)

// SleepTask parks a running task until wakeAt with phase and state saved,
// as sleep number sleep_seq + 1, whose wake job is jobID.
func (s *Store) SleepTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, phase string, state json.RawMessage, wakeAt time.Time, jobID int64) (arbortype.Task, error) {
	return scanTask(db.QueryRow(ctx, s.sql[qSleepTask], id, string(to), phase, nullJSON(state), wakeAt, jobID, conv))
}

// RetryTask parks a running task that failed until wakeAt, recording
// taskErr as its error and in its error history (newest historyLimit
// entries kept), with retries + 1 and sleep number sleep_seq + 1, whose wake
// job is jobID.
func (s *Store) RetryTask(ctx context.Context, db DB, conv string, id int64, to arbortype.Status, taskErr *arbortype.TaskError, wakeAt time.Time, historyLimit int, jobID int64) (arbortype.Task, error) {
	errJSON, err := marshalError(taskErr)
	if err != nil {
		return arbortype.Task{}, err
	}
	entry, err := historyEntry(taskErr)
	if err != nil {
		return arbortype.Task{}, err
	}
	return scanTask(db.QueryRow(ctx, s.sql[qRetryTask], id, string(to), nullJSON(errJSON), wakeAt, entry, historyLimit, jobID, conv))
}

func historyEntry(taskErr *arbortype.TaskError) (string, error) {
	if taskErr == nil {
		taskErr = &arbortype.TaskError{}
	}
	// try and at are stamped by the database; the detail is left out to
	// keep the history small (the latest error keeps it).
	b, err := json.Marshal(struct {
		Code         string `json:"code,omitempty"`
		Message      string `json:"message"`
		NonRetryable bool   `json:"non_retryable,omitempty"`
	}{taskErr.Code, taskErr.Message, taskErr.NonRetryable})
	return string(b), err
}

// SleepChannel is the LISTEN/NOTIFY channel on which the engine announces
// new sleeps of this schema. It is derived from the schema's name (hashed:
// a channel name is limited to 63 bytes), so wakers of different schemas of
// one database do not hear each other.
func (s *Store) SleepChannel() string {
	sum := sha256.Sum256([]byte(s.schema))
	return "arbor_sleep_" + hex.EncodeToString(sum[:8])
}

// SleepNotice is the payload of a notification on SleepChannel.
type SleepNotice struct {
	TaskID         int64     `json:"task_id"`
	ConversationID string    `json:"conversation_id"`
	SleepSeq       int64     `json:"sleep_seq"`
	WakeAt         time.Time `json:"wake_at"`
}

// NotifySleep announces a new sleep on SleepChannel; the notification is
// delivered when the transaction commits, and not at all if it rolls back.
func (s *Store) NotifySleep(ctx context.Context, db DB, n SleepNotice) error {
	payload, err := json.Marshal(n)
	if err != nil {
		return err
	}
	_, err = db.Exec(ctx, s.sql[qNotifySleep], s.SleepChannel(), string(payload))
	return err
}

// DueNow reports whether at has come by the database's clock, and that clock.
func (s *Store) DueNow(ctx context.Context, db DB, at time.Time) (bool, time.Time, error) {
	var (
		due bool
		now time.Time
	)
	err := db.QueryRow(ctx, s.sql[qDueNow], at).Scan(&due, &now)
	return due, now, err
}

// DeleteWakeJobs deletes the wake jobs among jobIDs that are not running
// and that no other transaction holds. A job left out is one River is
// moving at that moment: its scheduler making it available, or a producer
// fetching it to run. Waiting for it would stall every wake behind River's
// scheduler (whose transaction locks all the jobs due in the next 5 s, for
// hundreds of milliseconds under load); left alone, it runs, finds its
// sleep over and does nothing.
func (s *Store) DeleteWakeJobs(ctx context.Context, db DB, jobIDs []int64) (int64, error) {
	if len(jobIDs) == 0 {
		return 0, nil
	}
	tag, err := db.Exec(ctx, s.sql[qDeleteWakeJobs], jobIDs)
	return tag.RowsAffected(), err
}

// SleepingDue lists sleeping tasks of every conversation whose wake time is
// at or before until, soonest first, at most limit of them.
func (s *Store) SleepingDue(ctx context.Context, db DB, until time.Time, limit int) ([]SleepingTask, error) {
	rows, err := db.Query(ctx, s.sql[qSleepingDue], until, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (SleepingTask, error) {
		var st SleepingTask
		err := row.Scan(&st.TaskID, &st.ConversationID, &st.SleepSeq, &st.WakeAt)
		return st, err
	})
}

// TransactionNow returns the database's clock at the start of db's
// transaction: the now() its statements write.
func (s *Store) TransactionNow(ctx context.Context, db DB) (time.Time, error) {
	var now time.Time
	err := db.QueryRow(ctx, s.sql[qTransactionNow]).Scan(&now)
	return now, err
}

// DatabaseNow returns the database's clock.
func (s *Store) DatabaseNow(ctx context.Context, db DB) (time.Time, error) {
	var now time.Time
	err := db.QueryRow(ctx, s.sql[qDatabaseNow]).Scan(&now)
	return now, err
}

// LiveWakeJobs lists the wake jobs of a conversation that River has not
// finalized (not completed, cancelled or discarded), in id order.
func (s *Store) LiveWakeJobs(ctx context.Context, db DB, conversationID string) ([]WakeJob, error) {
	rows, err := db.Query(ctx, s.sql[qLiveWakeJobs], conversationID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (WakeJob, error) {
		var j WakeJob
		err := row.Scan(&j.ID, &j.State, &j.TaskID, &j.SleepSeq)
		return j, err
	})
}
