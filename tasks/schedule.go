package tasks

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// CreateSchedule creates a schedule: a turn of p.Kind started at the times
// of p.Cron (in p.TimeZone) or every p.Every, exactly once per tick across
// every node, by the maintenance of the runners (the elected leader, within
// a PollInterval of the tick; no runner, no turn: the ticks are then
// missed, and p.Missed says what happens to them). Each turn is a root task
// of p.Tenant, with p.Input, in p.ConversationID (queued behind a live
// turn there, whatever the kind's turn policy) or in a new conversation
// per tick, "<name>@<tick>".
//
// A schedule of an existing name is replaced: its definition becomes p,
// and it keeps its pause, its last firing and, unless its timing (cron,
// time zone, interval) changed, its next tick. So an application may
// create its schedules at every start, and an operator's pause outlives
// the redeploy. Bad params (no name or kind, a name over 150 bytes, both
// or neither of a cron expression and an interval, a bad expression or
// zone, an interval under a second, an unknown missed policy) are
// arbortype.ErrInvalidArgument, bad input arbortype.ErrInvalidJSON or
// arbortype.ErrPayloadTooLarge, with nothing written.
func (e *Engine) CreateSchedule(ctx context.Context, p arbortype.ScheduleParams) (arbortype.Schedule, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Schedule, error) { return e.core.CreateSchedule(ctx, tx, p) })
}

// Schedules lists every schedule, by name.
func (e *Engine) Schedules(ctx context.Context) ([]arbortype.Schedule, error) {
	return core.Read(ctx, e.core, func(db store.DB) ([]arbortype.Schedule, error) { return e.core.Schedules(ctx, db) })
}

// PauseSchedule stops schedule name from firing until ResumeSchedule. A
// turn it started already is not touched. An unknown name is
// arbortype.ErrNotFound.
func (e *Engine) PauseSchedule(ctx context.Context, name string) (arbortype.Schedule, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Schedule, error) { return e.core.PauseSchedule(ctx, tx, name, true) })
}

// ResumeSchedule lets a paused schedule fire again, from its first tick
// after now: the ticks that passed while it was paused are not missed ones
// (no run_once turn for them). Resuming a schedule that is not paused
// changes nothing. An unknown name is arbortype.ErrNotFound.
func (e *Engine) ResumeSchedule(ctx context.Context, name string) (arbortype.Schedule, error) {
	return core.Tx(ctx, e.core, func(tx pgx.Tx) (arbortype.Schedule, error) { return e.core.PauseSchedule(ctx, tx, name, false) })
}

// DeleteSchedule deletes schedule name; the turns it started are not
// touched. An unknown name is arbortype.ErrNotFound.
func (e *Engine) DeleteSchedule(ctx context.Context, name string) error {
	_, err := core.Tx(ctx, e.core, func(tx pgx.Tx) (struct{}, error) { return struct{}{}, e.core.DeleteSchedule(ctx, tx, name) })
	return err
}
