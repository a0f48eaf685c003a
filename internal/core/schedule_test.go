package core_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/testdb"
)

// Schedules run on a schema of each test's own: a firing fires every due
// schedule of its schema.
func setupSchedules(t *testing.T) *bundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	return newBundle(t, pool, schema)
}

// fire runs one firing of the schema's due schedules, in a transaction of
// its own, with a tick counted late more than grace after it.
func (b *bundle) fire(t *testing.T, grace time.Duration) []core.ScheduleFired {
	t.Helper()
	fired, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) ([]core.ScheduleFired, error) {
		return b.engine.C.FireSchedules(b.ctx, tx, grace, 100)
	})
	require.NoError(t, err)
	return fired
}

// due moves schedule name's next tick to ago before the database's now.
func (b *bundle) due(t *testing.T, name string, ago time.Duration) {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.schedules SET next_at = now() - $2::bigint * interval '1 microsecond' WHERE name = $1`,
		name, ago.Microseconds())
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
}

func (b *bundle) schedule(t *testing.T, name string) arbortype.Schedule {
	t.Helper()
	all, err := b.engine.Schedules(b.ctx)
	require.NoError(t, err)
	for _, s := range all {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no schedule %q", name)
	return arbortype.Schedule{}
}

// turns returns the root tasks of conversation conv.
func (b *bundle) turns(t *testing.T, conv string) []arbortype.Task {
	t.Helper()
	all, err := b.engine.ConversationTasks(b.ctx, conv)
	if errors.Is(err, arbortype.ErrNotFound) {
		return nil
	}
	require.NoError(t, err)
	return all
}

func (b *bundle) dbNow(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT now()`).Scan(&now))
	return now
}

// A tick that one firer holds (its transaction open) is skipped by every
// other, which neither waits nor fires it; once the first commits, the
// tick is past; had it rolled back, the tick would still be due, and the
// next firer fires it. One turn per tick.
func TestScheduleTickFiresOnceWhileAnotherFirerHoldsIt(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	_, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "hourly", Kind: "report", Every: time.Hour, ConversationID: b.conv})
	require.NoError(t, err)
	b.due(t, "hourly", time.Second)

	for _, commit := range []bool{false, true} {
		first, err := b.pool.BeginTx(b.ctx, b.engine.C.TxOptions())
		require.NoError(t, err)
		fired, err := b.engine.C.FireSchedules(b.ctx, first, time.Minute, 100)
		require.NoError(t, err)
		require.Len(t, fired, 1)
		require.True(t, fired[0].Created)

		// A second node, meanwhile: the row is locked, skipped.
		require.Empty(t, b.fire(t, time.Minute))

		if !commit {
			require.NoError(t, first.Rollback(b.ctx))
			require.Empty(t, b.turns(t, b.conv), "a firing rolled back started nothing")
			continue
		}
		require.NoError(t, first.Commit(b.ctx))
	}
	require.Empty(t, b.fire(t, time.Minute), "the tick is past")
	turns := b.turns(t, b.conv)
	require.Len(t, turns, 1)
	s := b.schedule(t, "hourly")
	require.Equal(t, turns[0].ID, s.LastTaskID)
	require.True(t, s.NextAt.After(b.dbNow(t)))
	require.True(t, s.LastTickAt.Add(time.Hour).Equal(s.NextAt))
}

// Many firers at once, on many due schedules: every schedule fires its
// tick exactly once.
func TestScheduleTicksFireOnceUnderRacingFirers(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	const schedules, firers = 30, 6
	for i := range schedules {
		name := fmt.Sprintf("s%02d", i)
		_, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: name, Kind: "k", Every: time.Hour})
		require.NoError(t, err)
		b.due(t, name, time.Second)
	}
	var wg sync.WaitGroup
	counts := make(chan int, firers)
	for range firers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for range 3 {
				fired, err := core.Tx(b.ctx, b.engine.C, func(tx pgx.Tx) ([]core.ScheduleFired, error) {
					return b.engine.C.FireSchedules(b.ctx, tx, time.Minute, 7)
				})
				if err != nil {
					t.Error(err)
					return
				}
				n += len(fired)
			}
			counts <- n
		}()
	}
	wg.Wait()
	close(counts)
	total := 0
	for n := range counts {
		total += n
	}
	total += len(b.fire(t, time.Minute)) // whatever the racers left
	require.Equal(t, schedules, total, "each schedule fired once")
	var roots int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.schema+`.tasks WHERE owner_task_id IS NULL`).Scan(&roots))
	require.Equal(t, schedules, roots, "one turn per tick")
}

// Ticks missed (three and a bit intervals, the last a minute ago): skip
// fires none of them when the last is late (beyond the grace), and fires
// the last when it is not; run_once fires one turn for them all. Either
// way the next tick is the first to come, on the schedule's chain.
func TestScheduleMissedTicks(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	for _, c := range []struct {
		name   string
		missed arbortype.MissedPolicy
		grace  time.Duration
		fires  bool
	}{
		{"skip-late", arbortype.MissedSkip, 10 * time.Second, false},
		{"skip-in-grace", arbortype.MissedSkip, time.Hour, true},
		{"default-is-skip", "", 10 * time.Second, false},
		{"run-once", arbortype.MissedRunOnce, 10 * time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: c.name, Kind: "k", Every: time.Hour, Missed: c.missed})
			require.NoError(t, err)
			b.due(t, c.name, 3*time.Hour+time.Minute)
			before := b.schedule(t, c.name)
			fired := b.fire(t, c.grace)
			require.Len(t, fired, 1)
			after := b.schedule(t, c.name)
			require.True(t, before.NextAt.Add(4*time.Hour).Equal(after.NextAt), "the first tick to come")
			require.True(t, after.NextAt.After(b.dbNow(t)))
			if !c.fires {
				require.True(t, fired[0].Tick.IsZero())
				require.Zero(t, after.LastTaskID)
				require.True(t, after.LastTickAt.IsZero())
				return
			}
			tick := before.NextAt.Add(3 * time.Hour)
			require.True(t, tick.Equal(fired[0].Tick), "the last tick missed")
			require.True(t, tick.Equal(after.LastTickAt))
			conv := core.ScheduleConversation(c.name, tick)
			turns := b.turns(t, conv)
			require.Len(t, turns, 1, "one turn for all the ticks")
			require.Equal(t, turns[0].ID, after.LastTaskID)
			require.Equal(t, core.ScheduleIdempotencyKey(c.name, tick), turns[0].IdempotencyKey)
			require.Empty(t, b.fire(t, c.grace))
		})
	}
}

// A cron schedule: the missed ticks of a day and more of hourly ticks, run
// once, leave the next tick at the next hour to come.
func TestScheduleCronRunOnce(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	s, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "hourly", Kind: "k", Cron: "0 * * * *", TimeZone: "Asia/Kolkata", Missed: arbortype.MissedRunOnce})
	require.NoError(t, err)
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	require.Equal(t, 0, s.NextAt.In(kolkata).Minute(), "on the hour in Kolkata")
	require.Equal(t, 30, s.NextAt.UTC().Minute(), "at half past in UTC")
	require.Equal(t, "Asia/Kolkata", s.TimeZone)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.schedules SET next_at = next_at - interval '30 hours'`)
	require.NoError(t, err)
	fired := b.fire(t, time.Minute)
	require.Len(t, fired, 1)
	last := s.NextAt.Add(-time.Hour) // the last tick at or before now
	if !s.NextAt.After(b.dbNow(t)) {
		last = s.NextAt
	}
	require.True(t, last.Equal(fired[0].Tick), "the last tick at or before now: %s, not %s", last, fired[0].Tick)
	require.True(t, last.Add(time.Hour).Equal(fired[0].Next))
	require.Len(t, b.turns(t, core.ScheduleConversation("hourly", fired[0].Tick)), 1)
}

// A paused schedule does not fire; resumed, its next tick is the first to
// come: the ticks that passed while it was paused are not missed ones,
// even for run_once.
func TestSchedulePauseAndResume(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	_, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "p", Kind: "k", Every: time.Hour, Missed: arbortype.MissedRunOnce, ConversationID: b.conv})
	require.NoError(t, err)
	s, err := b.engine.PauseSchedule(b.ctx, "p")
	require.NoError(t, err)
	require.True(t, s.Paused)
	b.due(t, "p", 5*time.Hour)
	require.Empty(t, b.fire(t, time.Minute), "paused")
	again, err := b.engine.PauseSchedule(b.ctx, "p")
	require.NoError(t, err)
	require.Equal(t, s.NextAt.Add(-0), s.NextAt)
	require.True(t, again.Paused)

	s, err = b.engine.ResumeSchedule(b.ctx, "p")
	require.NoError(t, err)
	require.False(t, s.Paused)
	require.True(t, s.NextAt.After(b.dbNow(t)))
	require.Empty(t, b.fire(t, time.Minute), "no run_once for the paused ticks")
	require.Empty(t, b.turns(t, b.conv))

	_, err = b.engine.PauseSchedule(b.ctx, "nope")
	require.ErrorIs(t, err, arbortype.ErrNotFound)
	_, err = b.engine.ResumeSchedule(b.ctx, "nope")
	require.ErrorIs(t, err, arbortype.ErrNotFound)
}

// A deleted schedule is gone: not listed, not fired; its turns stay.
func TestScheduleDelete(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	_, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "d", Kind: "k", Every: time.Minute, ConversationID: b.conv})
	require.NoError(t, err)
	b.due(t, "d", time.Second)
	require.Len(t, b.fire(t, time.Minute), 1)
	require.NoError(t, b.engine.DeleteSchedule(b.ctx, "d"))
	require.ErrorIs(t, b.engine.DeleteSchedule(b.ctx, "d"), arbortype.ErrNotFound)
	all, err := b.engine.Schedules(b.ctx)
	require.NoError(t, err)
	require.Empty(t, all)
	require.Empty(t, b.fire(t, time.Minute))
	require.Len(t, b.turns(t, b.conv), 1)
}

// A fixed conversation gets every tick's turn, queued behind the live one;
// without one, each tick's turn has a conversation of its own. Either way
// the turn is of the schedule's tenant, kind and input.
func TestScheduleConversationsAndTenant(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	input := json.RawMessage(`{"report":"daily"}`)
	_, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "fixed", Kind: "k", Input: input, Every: time.Hour, ConversationID: b.conv, Tenant: "acme"})
	require.NoError(t, err)
	_, err = b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "fresh", Kind: "k", Input: input, Every: time.Hour, Tenant: "globex"})
	require.NoError(t, err)
	var convs []string
	for range 2 {
		b.due(t, "fixed", time.Second)
		b.due(t, "fresh", time.Second)
		fired := b.fire(t, time.Minute)
		require.Len(t, fired, 2)
		for _, f := range fired {
			require.NoError(t, f.Err)
			require.True(t, f.Created)
			require.Equal(t, map[string]string{"fixed": "acme", "fresh": "globex"}[f.Name], f.Task.Tenant)
			require.Equal(t, "k", f.Task.Kind)
			require.JSONEq(t, string(input), string(f.Task.Input))
			require.Zero(t, f.Task.OwnerID)
			if f.Name == "fresh" {
				require.Equal(t, core.ScheduleConversation("fresh", f.Tick), f.Task.ConversationID)
				convs = append(convs, f.Task.ConversationID)
			} else {
				require.Equal(t, b.conv, f.Task.ConversationID)
			}
		}
	}
	turns := b.turns(t, b.conv)
	require.Len(t, turns, 2, "both ticks' turns in the fixed conversation")
	require.Equal(t, arbortype.StatusPending, turns[1].Status)
	require.Len(t, convs, 2)
	require.NotEqual(t, convs[0], convs[1], "a conversation per tick")
	for _, c := range convs {
		conv, err := b.engine.Conversation(b.ctx, c)
		require.NoError(t, err)
		require.Equal(t, "globex", conv.Tenant)
	}
}

// A tick whose create the engine refuses (the fixed conversation belongs
// to another tenant) starts nothing, says why in LastError, and the
// schedule moves on; the next tick that succeeds clears it.
func TestScheduleRefusedTickMovesOn(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "k", Tenant: "acme"})
	require.NoError(t, err)
	_, err = b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "r", Kind: "k", Every: time.Hour, ConversationID: b.conv, Tenant: "globex"})
	require.NoError(t, err)
	b.due(t, "r", time.Second)
	fired := b.fire(t, time.Minute)
	require.Len(t, fired, 1)
	require.ErrorIs(t, fired[0].Err, arbortype.ErrInvalidArgument)
	s := b.schedule(t, "r")
	require.Contains(t, s.LastError, "tenant")
	require.Zero(t, s.LastTaskID)
	require.True(t, s.NextAt.After(b.dbNow(t)))
	require.Len(t, b.turns(t, b.conv), 1)

	_, err = b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "r", Kind: "k", Every: time.Hour, ConversationID: b.conv, Tenant: "acme"})
	require.NoError(t, err)
	b.due(t, "r", time.Second)
	require.Len(t, b.fire(t, time.Minute), 1)
	s = b.schedule(t, "r")
	require.Empty(t, s.LastError)
	require.NotZero(t, s.LastTaskID)
}

// Creating a schedule of an existing name replaces its definition, keeping
// its pause and, unless its timing changed, its next tick.
func TestScheduleCreateReplaces(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	first, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "x", Kind: "k", Every: time.Hour})
	require.NoError(t, err)
	require.Equal(t, arbortype.MissedSkip, first.Missed)
	require.Equal(t, time.Hour, first.Every)
	_, err = b.engine.PauseSchedule(b.ctx, "x")
	require.NoError(t, err)
	same, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "x", Kind: "k2", Every: time.Hour, Missed: arbortype.MissedRunOnce})
	require.NoError(t, err)
	require.Equal(t, first.NextAt, same.NextAt)
	require.True(t, same.Paused, "an operator's pause outlives a redeploy")
	require.Equal(t, "k2", same.Kind)
	require.Equal(t, arbortype.MissedRunOnce, same.Missed)
	require.Equal(t, first.CreatedAt, same.CreatedAt)
	moved, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "x", Kind: "k2", Cron: "*/5 * * * *"})
	require.NoError(t, err)
	require.Equal(t, 0, moved.NextAt.Minute()%5)
	require.Empty(t, moved.Every)
	require.Equal(t, "*/5 * * * *", moved.Cron)
	all, err := b.engine.Schedules(b.ctx)
	require.NoError(t, err)
	require.Len(t, all, 1)
}

// Bad params are refused, with nothing written.
func TestScheduleRefusesBadParams(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	for what, c := range map[string]struct {
		p    arbortype.ScheduleParams
		want error
	}{
		"no name":        {arbortype.ScheduleParams{Kind: "k", Every: time.Hour}, arbortype.ErrInvalidArgument},
		"long name":      {arbortype.ScheduleParams{Name: fmt.Sprintf("%0151d", 0), Kind: "k", Every: time.Hour}, arbortype.ErrInvalidArgument},
		"no kind":        {arbortype.ScheduleParams{Name: "n", Every: time.Hour}, arbortype.ErrInvalidArgument},
		"neither":        {arbortype.ScheduleParams{Name: "n", Kind: "k"}, arbortype.ErrInvalidArgument},
		"both":           {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: time.Hour, Cron: "* * * * *"}, arbortype.ErrInvalidArgument},
		"bad cron":       {arbortype.ScheduleParams{Name: "n", Kind: "k", Cron: "61 * * * *"}, arbortype.ErrInvalidArgument},
		"never":          {arbortype.ScheduleParams{Name: "n", Kind: "k", Cron: "0 0 30 2 *"}, arbortype.ErrInvalidArgument},
		"bad zone":       {arbortype.ScheduleParams{Name: "n", Kind: "k", Cron: "* * * * *", TimeZone: "Mars/Olympus"}, arbortype.ErrInvalidArgument},
		"zone path":      {arbortype.ScheduleParams{Name: "n", Kind: "k", Cron: "* * * * *", TimeZone: "../../etc/passwd"}, arbortype.ErrInvalidArgument},
		"zone, interval": {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: time.Hour, TimeZone: "UTC"}, arbortype.ErrInvalidArgument},
		"short interval": {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: time.Second - 1}, arbortype.ErrInvalidArgument},
		"negative":       {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: -time.Hour}, arbortype.ErrInvalidArgument},
		"missed":         {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: time.Hour, Missed: "twice"}, arbortype.ErrInvalidArgument},
		"bad input":      {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: time.Hour, Input: json.RawMessage(`{`)}, arbortype.ErrInvalidJSON},
		"NUL name":       {arbortype.ScheduleParams{Name: "a\x00b", Kind: "k", Every: time.Hour}, arbortype.ErrInvalidArgument},
		"long conv":      {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: time.Hour, ConversationID: fmt.Sprintf("%0201d", 0)}, arbortype.ErrInvalidArgument},
		"long tenant":    {arbortype.ScheduleParams{Name: "n", Kind: "k", Every: time.Hour, Tenant: fmt.Sprintf("%0201d", 0)}, arbortype.ErrInvalidArgument},
		"invalid UTF-8":  {arbortype.ScheduleParams{Name: "n\xff", Kind: "k", Every: time.Hour}, arbortype.ErrInvalidArgument},
		"local zone":     {arbortype.ScheduleParams{Name: "n", Kind: "k", Cron: "* * * * *", TimeZone: "Local"}, arbortype.ErrInvalidArgument},
		"absolute zone":  {arbortype.ScheduleParams{Name: "n", Kind: "k", Cron: "* * * * *", TimeZone: "/usr/share/zoneinfo/UTC"}, arbortype.ErrInvalidArgument},
	} {
		_, err := b.engine.CreateSchedule(b.ctx, c.p)
		require.ErrorIs(t, err, c.want, what)
		require.False(t, errors.Is(err, context.Canceled))
	}
	all, err := b.engine.Schedules(b.ctx)
	require.NoError(t, err)
	require.Empty(t, all)
}

// A stored schedule that cannot fire (its expression, edited by hand or
// read by a stricter build, names no time) pauses itself with the reason,
// rather than come due at every poll; a schedule read back is created
// again as it is (its params round-trip).
func TestScheduleThatCannotFirePausesItself(t *testing.T) {
	t.Parallel()
	b := setupSchedules(t)
	s, err := b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "every", Kind: "k", Every: 90 * time.Second})
	require.NoError(t, err)
	again, err := b.engine.CreateSchedule(b.ctx, s.ScheduleParams)
	require.NoError(t, err, "a schedule's own params are valid")
	require.Equal(t, s.ScheduleParams, again.ScheduleParams)
	require.True(t, s.NextAt.Equal(again.NextAt))

	_, err = b.engine.CreateSchedule(b.ctx, arbortype.ScheduleParams{Name: "feb30", Kind: "k", Cron: "0 0 * * *", ConversationID: b.conv})
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE `+b.schema+`.schedules SET cron = '0 0 30 2 *', next_at = now() - interval '1 minute' WHERE name = 'feb30'`)
	require.NoError(t, err)
	fired := b.fire(t, time.Minute)
	require.Len(t, fired, 1)
	require.Error(t, fired[0].Err)
	got := b.schedule(t, "feb30")
	require.True(t, got.Paused)
	require.Contains(t, got.LastError, "names no time")
	require.True(t, got.LastTickAt.IsZero())
	require.Empty(t, b.turns(t, b.conv))
	require.Empty(t, b.fire(t, time.Minute))
}
