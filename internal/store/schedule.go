package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
)

// Schedules (docs/design.md §3.16): their rows, and the firer's lock and
// advance of the due ones (store/queries/schedule.sql).

var (
	qUpsertSchedule    = define("UpsertSchedule")
	qSchedules         = define("Schedules")
	qLockSchedule      = define("LockSchedule")
	qSetSchedulePaused = define("SetSchedulePaused")
	qDeleteSchedule    = define("DeleteSchedule")
	qAnyScheduleDue    = define("AnyScheduleDue")
	qDueSchedules      = define("DueSchedules")
	qAdvanceSchedule   = define("AdvanceSchedule")
)

// scanSchedule reads the schedule columns every statement of
// schedule.sql returns, in their order, then extra.
func scanSchedule(row pgx.Row, extra ...any) (arbortype.Schedule, error) {
	var (
		s                   arbortype.Schedule
		input               []byte
		conv, cron, lastErr *string
		everyUS, lastTask   *int64
		lastTick            *time.Time
		missed              string
	)
	dest := append([]any{&s.Name, &s.Tenant, &s.Kind, &input, &conv, &cron, &s.TimeZone, &everyUS, &missed, &s.Paused,
		&s.NextAt, &lastTick, &lastTask, &lastErr, &s.CreatedAt, &s.UpdatedAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return arbortype.Schedule{}, err
	}
	if input != nil {
		s.Input = json.RawMessage(input)
	}
	s.Missed = arbortype.MissedPolicy(missed)
	if conv != nil {
		s.ConversationID = *conv
	}
	if cron != nil {
		s.Cron = *cron
	} else {
		s.TimeZone = "" // an interval's: none, as its params say
	}
	if everyUS != nil {
		s.Every = time.Duration(*everyUS) * time.Microsecond
	}
	if lastTick != nil {
		s.LastTickAt = *lastTick
	}
	if lastTask != nil {
		s.LastTaskID = *lastTask
	}
	if lastErr != nil {
		s.LastError = *lastErr
	}
	return s, nil
}

func nullText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// UpsertSchedule creates schedule p.Name with its next tick at next, or
// replaces its definition: a replaced one keeps its next tick, its pause
// and its last firing unless its timing (cron, time zone, every) changed,
// when its next tick is next.
func (s *Store) UpsertSchedule(ctx context.Context, db DB, p arbortype.ScheduleParams, next time.Time) (arbortype.Schedule, error) {
	var every *int64
	if p.Cron == "" {
		us := p.Every.Microseconds()
		every = &us
	}
	return scanSchedule(db.QueryRow(ctx, s.sql[qUpsertSchedule], p.Name, p.Tenant, p.Kind, nullJSON(p.Input),
		nullText(p.ConversationID), nullText(p.Cron), p.TimeZone, every, string(p.Missed), next))
}

// Schedules lists every schedule by name.
func (s *Store) Schedules(ctx context.Context, db DB) ([]arbortype.Schedule, error) {
	rows, err := db.Query(ctx, s.sql[qSchedules])
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (arbortype.Schedule, error) { return scanSchedule(row) })
}

// LockSchedule reads schedule name and locks it (pgx.ErrNoRows if there
// is none).
func (s *Store) LockSchedule(ctx context.Context, db DB, name string) (arbortype.Schedule, error) {
	return scanSchedule(db.QueryRow(ctx, s.sql[qLockSchedule], name))
}

// SetSchedulePaused pauses schedule name, or resumes it with its next tick
// at next (pgx.ErrNoRows if there is none).
func (s *Store) SetSchedulePaused(ctx context.Context, db DB, name string, paused bool, next *time.Time) (arbortype.Schedule, error) {
	return scanSchedule(db.QueryRow(ctx, s.sql[qSetSchedulePaused], name, paused, next))
}

// DeleteSchedule deletes schedule name, and reports whether there was one.
func (s *Store) DeleteSchedule(ctx context.Context, db DB, name string) (bool, error) {
	tag, err := db.Exec(ctx, s.sql[qDeleteSchedule], name)
	return tag.RowsAffected() == 1, err
}

// AnyScheduleDue says whether a schedule is due by the database's clock.
func (s *Store) AnyScheduleDue(ctx context.Context, db DB) (bool, error) {
	var due bool
	err := db.QueryRow(ctx, s.sql[qAnyScheduleDue]).Scan(&due)
	return due, err
}

// DueSchedules locks at most limit schedules due by the transaction's
// clock, skipping those another transaction holds, and returns them with
// that clock.
func (s *Store) DueSchedules(ctx context.Context, tx pgx.Tx, limit int) ([]arbortype.Schedule, time.Time, error) {
	rows, err := tx.Query(ctx, s.sql[qDueSchedules], limit)
	if err != nil {
		return nil, time.Time{}, err
	}
	var now time.Time
	due, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (arbortype.Schedule, error) { return scanSchedule(row, &now) })
	return due, now, err
}

// ScheduleFiring is what AdvanceSchedule records of a firing.
type ScheduleFiring struct {
	Next time.Time
	// Tick is the tick fired (nil when none was: late ticks skipped, or
	// a schedule that cannot fire), and TaskID the turn created for it,
	// or Error why none was (or why the schedule cannot fire).
	Tick   *time.Time
	TaskID *int64
	Error  *string
}

// AdvanceSchedule records a firing of schedule name.
func (s *Store) AdvanceSchedule(ctx context.Context, tx pgx.Tx, name string, f ScheduleFiring) error {
	_, err := tx.Exec(ctx, s.sql[qAdvanceSchedule], name, f.Next, f.Tick, f.TaskID, f.Error)
	return err
}
