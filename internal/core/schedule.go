package core

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/cron"
	"github.com/arborhq/arbor/internal/store"
)

// Schedules (docs/design.md §3.16): a turn started at cron times or every
// interval. The rows say when each schedule's next tick is (next_at); a
// firer (FireSchedules, run by the maintenance leader every PollInterval)
// locks the due ones, creates their turns through Create and moves next_at
// past the database's now(), all in one transaction: a tick is fired once,
// whatever the number of nodes and however the transaction ends.

// maxScheduleName bounds a schedule's name: the conversation id
// "<name>@<tick>" and the idempotency key "arbor:schedule:<name>:<µs>"
// must fit in 200 bytes.
const maxScheduleName = 150

// checkSchedule refuses bad params, and returns p with its defaults filled
// in (UTC, skip) and its timing parsed.
func (e *Engine) checkSchedule(p arbortype.ScheduleParams) (arbortype.ScheduleParams, timing, error) {
	if err := checkText("name", p.Name, true); err != nil {
		return p, timing{}, err
	}
	if len(p.Name) > maxScheduleName {
		return p, timing{}, fmt.Errorf("name is %d bytes, over the limit of %d: %w", len(p.Name), maxScheduleName, arbortype.ErrInvalidArgument)
	}
	if err := checkText("kind", p.Kind, true); err != nil {
		return p, timing{}, err
	}
	if err := checkText("tenant", p.Tenant, false); err != nil {
		return p, timing{}, err
	}
	if err := checkText("conversation id", p.ConversationID, false); err != nil {
		return p, timing{}, err
	}
	if err := e.checkJSON("input", p.Input); err != nil {
		return p, timing{}, err
	}
	switch p.Missed {
	case "":
		p.Missed = arbortype.MissedSkip
	case arbortype.MissedSkip, arbortype.MissedRunOnce:
	default:
		return p, timing{}, fmt.Errorf("missed policy %q: want %q or %q: %w", p.Missed, arbortype.MissedSkip, arbortype.MissedRunOnce, arbortype.ErrInvalidArgument)
	}
	var t timing
	switch {
	case p.Cron != "" && p.Every != 0:
		return p, timing{}, fmt.Errorf("both a cron expression and an interval: set one: %w", arbortype.ErrInvalidArgument)
	case p.Cron != "":
		if err := checkText("cron", p.Cron, true); err != nil {
			return p, timing{}, err
		}
		sched, err := cron.Parse(p.Cron)
		if err != nil {
			return p, timing{}, fmt.Errorf("%w: %w", err, arbortype.ErrInvalidArgument)
		}
		if p.TimeZone == "" {
			p.TimeZone = "UTC"
		}
		loc, err := loadLocation(p.TimeZone)
		if err != nil {
			return p, timing{}, err
		}
		t = timing{cron: sched, loc: loc}
	case p.Every != 0:
		if p.Every < time.Second {
			return p, timing{}, fmt.Errorf("interval %s: at least a second: %w", p.Every, arbortype.ErrInvalidArgument)
		}
		if p.TimeZone != "" {
			return p, timing{}, fmt.Errorf("a time zone is for a cron expression, not an interval: %w", arbortype.ErrInvalidArgument)
		}
		p.TimeZone = "UTC"
		p.Every = p.Every.Truncate(time.Microsecond)
		t = timing{every: p.Every}
	default:
		return p, timing{}, fmt.Errorf("neither a cron expression nor an interval: set one: %w", arbortype.ErrInvalidArgument)
	}
	return p, t, nil
}

func loadLocation(name string) (*time.Location, error) {
	if err := checkText("time zone", name, true); err != nil {
		return nil, err
	}
	// LoadLocation reads a file by the name: refuse what is no zone name
	// before it does (".." and the like).
	if len(name) > 100 || strings.HasPrefix(name, "/") || strings.Contains(name, "..") || strings.EqualFold(name, "local") {
		return nil, fmt.Errorf("time zone %q: %w", name, arbortype.ErrInvalidArgument)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("time zone %q: %w", name, arbortype.ErrInvalidArgument)
	}
	return loc, nil
}

// timing is a schedule's ticks: cron times in loc, or every every.
type timing struct {
	cron  cron.Schedule
	loc   *time.Location
	every time.Duration
}

// timingOf parses a stored schedule's timing.
func timingOf(s arbortype.Schedule) (timing, error) {
	if s.Cron == "" {
		return timing{every: s.Every}, nil
	}
	c, err := cron.Parse(s.Cron)
	if err != nil {
		return timing{}, err
	}
	loc, err := loadLocation(s.TimeZone)
	if err != nil {
		return timing{}, err
	}
	return timing{cron: c, loc: loc}, nil
}

// first returns the first tick after now of a schedule created then: an
// interval's ticks run from now, to the second.
func (t timing) first(now time.Time) time.Time {
	if t.every > 0 {
		return now.Truncate(time.Second).Add(t.every)
	}
	return t.cron.Next(now.In(t.loc))
}

// after returns the ticks of the chain through next: the last at or before
// now (zero if next is after now) and the first after now. An interval's
// ticks are next plus whole intervals; a cron expression's, its times.
func (t timing) after(next, now time.Time) (last, following time.Time) {
	if next.After(now) {
		return time.Time{}, next
	}
	if t.every > 0 {
		n := now.Sub(next) / t.every
		last = next.Add(n * t.every)
		return last, last.Add(t.every)
	}
	// Start the walk near now: a schedule missed for a year of minutes
	// is not walked minute by minute from its old next tick.
	last = next
	for _, back := range []time.Duration{time.Hour, 24 * time.Hour, 32 * 24 * time.Hour, 367 * 24 * time.Hour} {
		from := now.Add(-back)
		if !from.After(next) {
			break
		}
		if f := t.cron.Next(from.In(t.loc)); !f.IsZero() && !f.After(now) {
			last = f
			break
		}
	}
	for {
		f := t.cron.Next(last.In(t.loc))
		if f.IsZero() || f.After(now) {
			return last, f
		}
		last = f
	}
}

// CreateSchedule creates a schedule, or replaces the definition of the
// one of that name (see tasks.Engine.CreateSchedule).
func (e *Engine) CreateSchedule(ctx context.Context, tx pgx.Tx, p arbortype.ScheduleParams) (arbortype.Schedule, error) {
	p, t, err := e.checkSchedule(p)
	if err != nil {
		return arbortype.Schedule{}, fmt.Errorf("create schedule %q: %w", p.Name, err)
	}
	now, err := e.Store.TransactionNow(ctx, tx)
	if err != nil {
		return arbortype.Schedule{}, fmt.Errorf("create schedule %q: %w", p.Name, err)
	}
	s, err := e.Store.UpsertSchedule(ctx, tx, p, t.first(now))
	if err != nil {
		return arbortype.Schedule{}, fmt.Errorf("create schedule %q: %w", p.Name, mapDBError(err))
	}
	return s, nil
}

// Schedules lists every schedule by name.
func (e *Engine) Schedules(ctx context.Context, db store.DB) ([]arbortype.Schedule, error) {
	return e.Store.Schedules(ctx, db)
}

// PauseSchedule pauses schedule name, or resumes it (paused false) with
// its next tick the first after now: the ticks that passed while it was
// paused are not missed ones. Pausing a paused schedule, or resuming a
// running one, changes nothing.
func (e *Engine) PauseSchedule(ctx context.Context, tx pgx.Tx, name string, paused bool) (arbortype.Schedule, error) {
	what := "pause"
	if !paused {
		what = "resume"
	}
	s, err := e.Store.LockSchedule(ctx, tx, name)
	switch {
	case store.IsNoRows(err):
		return arbortype.Schedule{}, fmt.Errorf("%s schedule %q: %w", what, name, arbortype.ErrNotFound)
	case err != nil:
		return arbortype.Schedule{}, fmt.Errorf("%s schedule %q: %w", what, name, err)
	case s.Paused == paused:
		return s, nil
	}
	var next *time.Time
	if !paused {
		t, err := timingOf(s)
		if err != nil {
			return arbortype.Schedule{}, fmt.Errorf("%s schedule %q: %w", what, name, err)
		}
		now, err := e.Store.TransactionNow(ctx, tx)
		if err != nil {
			return arbortype.Schedule{}, fmt.Errorf("%s schedule %q: %w", what, name, err)
		}
		_, f := t.after(s.NextAt, now)
		next = &f
	}
	s, err = e.Store.SetSchedulePaused(ctx, tx, name, paused, next)
	if err != nil {
		return arbortype.Schedule{}, fmt.Errorf("%s schedule %q: %w", what, name, err)
	}
	return s, nil
}

// DeleteSchedule deletes schedule name. The turns it started are not
// touched.
func (e *Engine) DeleteSchedule(ctx context.Context, tx pgx.Tx, name string) error {
	ok, err := e.Store.DeleteSchedule(ctx, tx, name)
	switch {
	case err != nil:
		return fmt.Errorf("delete schedule %q: %w", name, err)
	case !ok:
		return fmt.Errorf("delete schedule %q: %w", name, arbortype.ErrNotFound)
	}
	return nil
}

// ScheduleFired is one schedule's firing, as FireSchedules reports it.
type ScheduleFired struct {
	Name string
	// Tick is the tick a turn was started for (zero when late ticks were
	// skipped), Task that turn (zero when none was created: Err says why),
	// Next the schedule's next tick.
	Tick, Next time.Time
	Task       Task
	Created    bool
	Err        error
}

// ScheduleIdempotencyKey is the idempotency key of the turn schedule name
// starts for tick: a firing repeated for the same tick (its schedule
// deleted and created again, say) finds the turn of the first.
func ScheduleIdempotencyKey(name string, tick time.Time) string {
	return "arbor:schedule:" + name + ":" + strconv.FormatInt(tick.UnixMicro(), 10)
}

// ScheduleConversation is the conversation of the turn that schedule name
// with no conversation of its own starts for tick: "<name>@<tick>", the
// tick in UTC, RFC 3339 with the fraction of a second if it has one.
func ScheduleConversation(name string, tick time.Time) string {
	return name + "@" + tick.UTC().Format(time.RFC3339Nano)
}

// FireSchedules fires at most limit due schedules in tx, by tx's clock
// (its now()): for each, the tick to run (see below) gets its turn,
// created by Create in a savepoint, and next_at moves to the first tick
// after now. A tick is late when now is more than grace after it. A
// schedule that comes due runs its last tick at or before now, if that
// tick is not late or its policy is run_once; its earlier ticks are
// dropped (skip), or covered by that one turn (run_once). A create that
// the engine refuses (a fixed conversation of another tenant, an input
// over the payload limit since lowered, a key taken by a turn of another
// kind) costs that tick only: its error is recorded in the schedule's
// last_error, and the schedule moves on. Any other error is returned, and
// tx must be rolled back: nothing was fired.
func (e *Engine) FireSchedules(ctx context.Context, tx pgx.Tx, grace time.Duration, limit int) ([]ScheduleFired, error) {
	due, now, err := e.Store.DueSchedules(ctx, tx, limit)
	if err != nil {
		return nil, fmt.Errorf("fire schedules: %w", err)
	}
	out := make([]ScheduleFired, 0, len(due))
	for _, s := range due {
		f := ScheduleFired{Name: s.Name}
		var rec store.ScheduleFiring
		t, terr := timingOf(s)
		var last time.Time
		if terr == nil {
			last, f.Next = t.after(s.NextAt, now)
		}
		switch {
		case terr != nil || f.Next.IsZero():
			// A stored expression this build cannot read, or that names
			// no time any more: the schedule pauses itself rather than
			// come due at every poll.
			if terr == nil {
				terr = errors.New("its cron expression names no time after now")
			}
			f.Err = fmt.Errorf("schedule %q: %w", s.Name, terr)
			msg := f.Err.Error()
			if _, err := e.Store.SetSchedulePaused(ctx, tx, s.Name, true, nil); err != nil {
				return nil, fmt.Errorf("fire schedules: %w", err)
			}
			rec = store.ScheduleFiring{Next: s.NextAt, Error: &msg}
			if err := e.Store.AdvanceSchedule(ctx, tx, s.Name, rec); err != nil {
				return nil, fmt.Errorf("fire schedules: %w", err)
			}
			out = append(out, f)
			continue
		case s.Missed == arbortype.MissedSkip && now.Sub(last) > grace:
			rec = store.ScheduleFiring{Next: f.Next}
		default:
			f.Tick = last
			task, err := Savepoint(ctx, tx, func(tx pgx.Tx) (createdTask, error) {
				t, c, err := e.Create(ctx, tx, e.scheduledTurn(s, last))
				return createdTask{t, c}, err
			})
			f.Task, f.Created = task.t, task.created
			rec = store.ScheduleFiring{Next: f.Next, Tick: &f.Tick}
			switch {
			case err == nil:
				rec.TaskID = &f.Task.ID
			case refusal(err):
				f.Err = err
				msg := err.Error()
				rec.Error = &msg
			default:
				return nil, fmt.Errorf("fire schedule %q: %w", s.Name, err)
			}
		}
		if err := e.Store.AdvanceSchedule(ctx, tx, s.Name, rec); err != nil {
			return nil, fmt.Errorf("fire schedules: %w", err)
		}
		out = append(out, f)
	}
	return out, nil
}

type createdTask struct {
	t       Task
	created bool
}

// scheduledTurn is the create of schedule s's turn for tick.
func (e *Engine) scheduledTurn(s arbortype.Schedule, tick time.Time) CreateParams {
	conv := s.ConversationID
	if conv == "" {
		conv = ScheduleConversation(s.Name, tick)
	}
	return CreateParams{CreateParams: arbortype.CreateParams{
		ConversationID: conv,
		Kind:           s.Kind,
		Input:          s.Input,
		Tenant:         s.Tenant,
		IdempotencyKey: ScheduleIdempotencyKey(s.Name, tick),
	}}
}

// refusal says whether err is the engine's refusal of a create (bad input
// for it, by arbor's checks or the database's), which no retry changes.
func refusal(err error) bool {
	for _, s := range []error{arbortype.ErrInvalidArgument, arbortype.ErrInvalidJSON, arbortype.ErrPayloadTooLarge,
		arbortype.ErrIdempotencyConflict, arbortype.ErrInvalidTransition} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
