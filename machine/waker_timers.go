package machine

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// The waker's timers: sleeps due within the horizon, armed from the poll and
// the notifications, each woken by a transaction of its own; River wakes
// what they miss (waker.go).

// offsetSampleMaxRTT is the slowest clock read whose offset is trusted.
const offsetSampleMaxRTT = 20 * time.Millisecond

// wakeTimeout bounds one timer's wake transaction.
const wakeTimeout = 30 * time.Second

type sleepKey struct{ taskID, sleepSeq int64 }

type timerEntry struct {
	timer *time.Timer
	// touched is when the entry was armed or last fired: a poll whose
	// snapshot is older cannot prune it.
	touched time.Time
	// failed marks a timer whose wake failed; the next poll re-arms it.
	failed bool
	// wakeAt is the sleep's wake time, by the database's clock.
	wakeAt time.Time
}

// listenLoop keeps a connection LISTENing on the schema's sleep channel and
// arms a timer for each announced sleep within the horizon. After every
// (re)subscription it asks for a poll, which covers what it missed.
func (w *Waker) listenLoop(ctx context.Context) {
	defer w.wg.Done()
	pool := w.core.Listener()
	if pool == nil {
		return // behind a pooler with no ListenPool: the poll alone
	}
	listen(ctx, pool, w.core.Store.SleepChannel(), w.logger, w.pollSoon, func(n *pgconn.Notification) {
		var notice store.SleepNotice
		if err := json.Unmarshal([]byte(n.Payload), &notice); err != nil {
			w.logger.WarnContext(ctx, "arbor: waker got a malformed sleep notification", slog.String("payload", n.Payload))
			return
		}
		w.consider(ctx, store.SleepingTask(notice), time.Now())
	})
}

func (w *Waker) pollSoon() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// pollLoop re-reads the sleeping tasks due within the horizon every
// PollInterval, and when the LISTEN loop asks.
func (w *Waker) pollLoop(ctx context.Context) {
	defer w.wg.Done()
	ticker := time.NewTicker(w.cfg.PollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-w.kick:
		}
		if err := w.poll(ctx); err != nil && ctx.Err() == nil {
			w.logger.WarnContext(ctx, "arbor: waker poll failed", slog.String("error", err.Error()))
		}
	}
}

func (w *Waker) poll(ctx context.Context) error {
	started := time.Now()
	conn, err := w.core.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// Time the clock read alone (not the wait for a connection): the
	// offset is known to within half the round trip, so a slow sample is
	// not taken.
	asked := time.Now()
	dbNow, err := w.core.Store.DatabaseNow(ctx, conn)
	if err != nil {
		return err
	}
	if rtt := time.Since(asked); rtt <= offsetSampleMaxRTT {
		w.offset.Store(int64(dbNow.Sub(asked.Add(rtt / 2))))
	}
	due, err := w.core.Store.SleepingDue(ctx, conn, dbNow.Add(w.cfg.Horizon), w.cfg.PollLimit)
	if err != nil {
		return err
	}
	conn.Release()
	seen := make(map[sleepKey]bool, len(due))
	for _, st := range due {
		seen[sleepKey{st.TaskID, st.SleepSeq}] = true
		w.consider(ctx, st, started)
	}
	if len(due) == w.cfg.PollLimit {
		return nil // a partial view: prune nothing
	}
	// Forget the timers of sleeps that are over, unless they were armed or
	// fired after this poll's snapshot was taken.
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, e := range w.timers {
		if !seen[k] && e.touched.Before(started) {
			e.timer.Stop()
			delete(w.timers, k)
		}
	}
	return nil
}

// consider arms a timer for st if it is within the horizon, passes the
// filter and has no timer yet (or its last wake failed). seenAt is when the
// caller's view of st was read.
func (w *Waker) consider(ctx context.Context, st store.SleepingTask, seenAt time.Time) {
	if w.cfg.Filter != nil && !w.cfg.Filter(st.ConversationID) {
		return
	}
	delay := w.untilDB(st.WakeAt)
	if delay > w.cfg.Horizon {
		return
	}
	key := sleepKey{st.TaskID, st.SleepSeq}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.running {
		return
	}
	if e, ok := w.timers[key]; ok && !(e.failed && e.touched.Before(seenAt)) {
		return
	}
	w.armLocked(ctx, key, st.ConversationID, st.WakeAt, delay)
}

// untilDB is how long until t by the database's clock.
func (w *Waker) untilDB(t time.Time) time.Duration {
	return time.Until(t) - time.Duration(w.offset.Load())
}

func (w *Waker) armLocked(ctx context.Context, key sleepKey, conversationID string, wakeAt time.Time, delay time.Duration) {
	e := &timerEntry{touched: time.Now(), wakeAt: wakeAt}
	e.timer = time.AfterFunc(max(delay, 0), func() { w.fire(ctx, key, conversationID, e) })
	w.timers[key] = e
}

// fire wakes a timer's sleep. It runs on the timer's goroutine; Stop waits
// for it.
func (w *Waker) fire(ctx context.Context, key sleepKey, conversationID string, e *timerEntry) {
	w.mu.Lock()
	if !w.running || w.timers[key] != e {
		w.mu.Unlock()
		return
	}
	w.wg.Add(1)
	w.mu.Unlock()
	defer w.wg.Done()

	// A wake that started finishes even if Stop comes meanwhile: cancelling
	// it mid-commit would only make its outcome ambiguous.
	// A wake is idempotent (it wakes only the sleep it names, if still
	// sleeping), so one whose commit had no answer is simply made again.
	wakeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
	var woken bool
	var err error
	for {
		if w.wake != nil {
			woken, err = w.wake(wakeCtx, key.taskID, key.sleepSeq, conversationID)
		} else {
			woken, err = core.Tx(wakeCtx, w.core, func(tx pgx.Tx) (bool, error) {
				return w.core.WakeSleeping(wakeCtx, tx, key.taskID, key.sleepSeq)
			})
		}
		if !errors.Is(err, arbortype.ErrAmbiguous) || wakeCtx.Err() != nil {
			break
		}
	}
	cancel()
	var notDue *core.NotDueError
	w.mu.Lock()
	switch {
	case errors.As(err, &notDue):
		// Our clock ran ahead of the database's: try again when it is due.
		if w.running && w.timers[key] == e {
			w.armLocked(ctx, key, conversationID, e.wakeAt, notDue.Remaining()+time.Millisecond)
		}
		w.mu.Unlock()
		return
	case err != nil:
		e.failed, e.touched = true, time.Now()
		w.mu.Unlock()
		if ctx.Err() == nil {
			w.logger.WarnContext(ctx, "arbor: timer wake failed; River or the next poll will retry",
				slog.Int64("task_id", key.taskID), slog.Int64("sleep_seq", key.sleepSeq), slog.String("error", err.Error()))
		}
		return
	}
	e.touched = time.Now()
	w.mu.Unlock()
	if woken && w.cfg.OnWake != nil {
		w.cfg.OnWake(Wake{TaskID: key.taskID, SleepSeq: key.sleepSeq, ConversationID: conversationID, By: WokenByTimer,
			Late: max(-w.untilDB(e.wakeAt), 0)})
	}
}

// Armed returns how many sleeps have a timer (armed, or fired and not yet
// forgotten). For tests and metrics.
func (w *Waker) Armed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.timers)
}
