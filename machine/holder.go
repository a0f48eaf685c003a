package machine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// nodeLease is a runner's hold on everything it holds: its holder row (its
// life), renewed by one statement every sixth of the lease on a pool of
// its own, and the fence that stops the runner's handlers, from the local
// clock alone, before the lease can have expired in the database (see
// docs/architecture.md, "Fencing").
//
// Times are kept as nanoseconds since base, a reading of the monotonic
// clock, so that a wall-clock step changes nothing.
type nodeLease struct {
	name   string
	ttl    time.Duration
	core   *core.Engine // on the renewer's own pool
	logger *slog.Logger
	base   time.Time

	// confirmed: the lease surely lasts until then (the send time of the
	// last renewal that succeeded, plus ttl).
	confirmed atomic.Int64
	// fired is set from the moment the fence fires until a renewal confirms
	// the lease again (and the runner has re-validated what it held).
	fired atomic.Bool

	mu       sync.Mutex
	id       int64   // the current life's holder row
	ownLives []int64 // this process's earlier lives: their runs it stopped itself

	// onFire stops every handler and marks every held conversation lapsed;
	// onConfirm is called when a renewal confirms the lease after the fence
	// fired (newLife: the old row had expired, and this is a new one). Both
	// are called from the fence's and the renewer's goroutines, never with
	// mu held.
	onFire    func()
	onConfirm func(newLife bool)
	// onLife, if set, is told of each new life (its holder row's id and
	// birth), before the life acts: the runner locks its life's file.
	onLife func(id int64, created time.Time)

	fireMu sync.Mutex // serializes fire
	kick   chan struct{}

	slowWarned atomic.Int64 // when the last slow connection was warned of (since base)
}

func newNodeLease(c *core.Engine, name string, ttl time.Duration, logger *slog.Logger) *nodeLease {
	return &nodeLease{name: name, ttl: ttl, core: c, logger: logger, base: time.Now(), kick: make(chan struct{}, 1)}
}

func (l *nodeLease) since(t time.Time) int64 { return int64(t.Sub(l.base)) }

// margin is how long before the end of the confirmed lease the fence fires:
// the time handlers have to honour their cancelled context before another
// node may take their conversations.
func (l *nodeLease) margin() time.Duration { return l.ttl / 4 }

// usable reports whether the runner may act as the holder at now: the fence
// has not fired, and now is before confirmed − margin.
func (l *nodeLease) usable(now time.Time) bool {
	return !l.fired.Load() && l.fresh(now)
}

// holder returns the current life's row and this process's earlier lives.
func (l *nodeLease) holder() (id int64, own []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.id, append([]int64(nil), l.ownLives...)
}

// begin starts the first life: a holder row of the runner's own.
func (l *nodeLease) begin(ctx context.Context) error {
	sent := time.Now()
	type life struct {
		id      int64
		created time.Time
	}
	lf, err := core.Read(ctx, l.core, func(db store.DB) (life, error) {
		id, created, err := l.core.NewHolder(ctx, db, l.name, l.ttl)
		return life{id, created}, err
	})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.id = lf.id
	l.mu.Unlock()
	if l.onLife != nil {
		l.onLife(lf.id, lf.created)
	}
	l.confirm(sent)
	return nil
}

// confirm records a renewal sent at sent that succeeded.
func (l *nodeLease) confirm(sent time.Time) {
	until := l.since(sent) + int64(l.ttl)
	for {
		cur := l.confirmed.Load()
		if until <= cur || l.confirmed.CompareAndSwap(cur, until) {
			break
		}
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// fire stops the runner's handlers: the lease is not confirmed. It is
// idempotent until the lease is confirmed again.
func (l *nodeLease) fire() {
	l.fireMu.Lock()
	defer l.fireMu.Unlock()
	if l.fired.Swap(true) {
		return
	}
	l.onFire()
}

// checkFence fires the fence if now is past confirmed − margin; it reports
// whether the lease is usable. Handler contexts call it from Err.
func (l *nodeLease) checkFence(now time.Time) bool {
	if l.usable(now) {
		return true
	}
	l.fire()
	return false
}

// fenceLoop fires the fence at confirmed − margin unless a renewal moved it
// first. It touches neither the pool nor the network.
func (l *nodeLease) fenceLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if !l.fired.Load() {
			due := time.Duration(l.confirmed.Load()-int64(l.margin())) - time.Since(l.base)
			if due <= 0 {
				l.fire()
				continue
			}
			t.Reset(due)
		} else {
			t.Reset(time.Hour)
		}
		select {
		case <-ctx.Done():
			return
		case <-l.kick:
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// renewLoop renews the holder row every sixth of the lease, and again
// soon after a failure or an answer too late to confirm the lease (every
// 20 ms, at most a sixteenth of the lease, see answered), each
// try bounded by half the lease: a slow answer (a starved machine, a slow
// fsync) is waited for rather than cut, which would only cost a new
// connection on top. A renewal that finds the row expired starts a new
// life. The fence fires at three quarters of the lease after the last
// renewal that succeeded: with renewals every sixth, that is four
// chances.
//
// The next renewal is timed from the send of the last one that confirmed
// the lease, not from its answer: after an answer that came late (a
// starved process, a slow commit) but still in time to confirm, a sixth of
// the lease counted from the answer could pass the fence point before the
// next renewal, firing the fence under a live row. When the last round
// trip took a sixth of the lease or more, the next renewal goes at once
// (never faster than one per round trip).
func (l *nodeLease) renewLoop(ctx context.Context) {
	retry := min(20*time.Millisecond, l.ttl/16)
	wait := l.ttl / 6
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = retry
		if l.renewOnce(ctx) {
			wait = l.untilNextRenewal(time.Now())
		}
	}
}

// untilNextRenewal is how long after now the next renewal is due: a sixth
// of the lease after the send of the last renewal that confirmed it (0:
// at once).
func (l *nodeLease) untilNextRenewal(now time.Time) time.Duration {
	lastSent := l.confirmed.Load() - int64(l.ttl)
	return max(0, time.Duration(lastSent+int64(l.ttl/6)-l.since(now)))
}

// renewOnce makes one renewal and reports whether it confirmed the lease.
func (l *nodeLease) renewOnce(ctx context.Context) bool {
	id, _ := l.holder()
	rctx, cancel := context.WithTimeout(ctx, l.ttl/2)
	defer cancel()
	sent := time.Now()
	live, err := l.renewOn(rctx, id)
	if err != nil {
		if ctx.Err() == nil {
			level := slog.LevelDebug
			if !l.usable(time.Now().Add(l.ttl / 4)) {
				level = slog.LevelWarn // the fence may fire before the next try
			}
			l.logger.Log(ctx, level, "arbor: renewing the node's lease failed; trying again", slog.String("error", err.Error()))
		}
		return false
	}
	if !live {
		// The row expired: the conversations it held may have been taken
		// over. Stop everything (the fence has fired already, unless the
		// clocks disagree) and start a new life.
		l.fire()
		sent = time.Now()
		nid, created, err := l.core.NewHolder(rctx, l.core.Pool, l.name, l.ttl)
		if err != nil {
			if ctx.Err() == nil {
				l.logger.Warn("arbor: the node's lease expired and a new one could not be taken yet; trying again", slog.String("error", err.Error()))
			}
			return false
		}
		l.mu.Lock()
		l.ownLives = append(l.ownLives, l.id)
		l.id = nid
		l.mu.Unlock()
		if l.onLife != nil {
			l.onLife(nid, created)
		}
		l.logger.Warn("arbor: the node's lease had expired in the database; its conversations are free, and it takes back those no other node took",
			slog.Int64("holder_id", nid))
		l.confirm(sent)
		l.reconfirmed(true)
		return true
	}
	return l.answered(sent)
}

// answered takes in a renewal sent at sent that found the row live, and
// reports whether it confirmed the lease.
//
// A renewal is confirmed only after the fence had its say: one whose
// answer came back past the fence point (the fence goroutine starved, the
// statement or its commit slow) may have been invisible to a take-over
// until then — the old row, expired, is what another node read — so the
// fence fires first, as it would have on time, and the conversations are
// re-validated by epoch before anything runs again. Without this,
// confirming would move the fence point past now, and a handler whose
// context had not yet seen the clock would go on in a conversation another
// node took.
//
// And it ends the fence's firing only when it leaves the lease usable: a
// renewal sent long before its answer was read (the process frozen or
// starved in between) vouches for the lease only until its send time plus
// the lease, which may be past the fence point already, or nearly expired
// in the database. Such an answer is no confirmation: the fence stays
// fired, and the caller renews again at once (false), rather than a sixth
// of the lease later, by when the row may have expired and every
// conversation of the node gone free.
func (l *nodeLease) answered(sent time.Time) bool {
	l.checkFence(time.Now())
	l.confirm(sent)
	if !l.fresh(time.Now()) {
		l.fire() // past the fence point, whatever the first look saw
		return false
	}
	if l.fired.Load() {
		l.reconfirmed(false)
	}
	return true
}

// fresh reports whether now is before the fence point of the confirmed
// lease (confirmed − margin), whether or not the fence has fired.
func (l *nodeLease) fresh(now time.Time) bool {
	return l.since(now) < l.confirmed.Load()-int64(l.margin())
}

// usableUntil returns when the lease stops being usable as things stand at
// now (the fence point, on the monotonic clock), and false when it is not
// usable at now.
func (l *nodeLease) usableUntil(now time.Time) (time.Time, bool) {
	until := l.base.Add(time.Duration(l.confirmed.Load() - int64(l.margin())))
	return until, l.usable(now) && now.Before(until)
}

// slowConnect is the part of the lease past which the renewer's wait for
// a connection is reported: a wait that long, after every connection of
// the node was cut (a failover, a proxy's restart, an administrator's
// pg_terminate_backend), is one a little longer from firing the fence.
func (l *nodeLease) slowConnect() time.Duration { return l.ttl / 4 }

// renewOn renews row id on the renewer's pool. The connection is acquired
// apart, so that a slow one — a new connection to a busy server, after the
// old one was cut — is told to the operator: a lease shorter than the time
// a reconnect takes under load fires the fence on every such fault (a
// once task's stopped run is then abandoned), however transient.
func (l *nodeLease) renewOn(ctx context.Context, id int64) (bool, error) {
	start := time.Now()
	conn, err := l.core.Pool.Acquire(ctx)
	if waited := time.Since(start); waited > l.slowConnect() {
		l.warnSlowConnect(waited)
	}
	if err != nil {
		return false, fmt.Errorf("renew holder %d: get a connection: %w", id, err)
	}
	defer conn.Release()
	return l.core.RenewHolder(ctx, conn, id, l.ttl)
}

// warnSlowConnect logs, at most once a minute, that the renewer waited
// waited for a connection.
func (l *nodeLease) warnSlowConnect(waited time.Duration) {
	now := l.since(time.Now())
	last := l.slowWarned.Load()
	if last != 0 && now-last < int64(time.Minute) || !l.slowWarned.CompareAndSwap(last, now) {
		return
	}
	l.logger.Warn("arbor: the node's lease renewal waited long for a database connection; a ConversationLease this short fires the fence (stopping every handler) when reconnecting takes a little longer: raise it well above the time a reconnect takes under load",
		slog.Duration("waited", waited), slog.Duration("conversation_lease", l.ttl))
}

// reconfirmed ends the fence's firing: the lease is confirmed again.
func (l *nodeLease) reconfirmed(newLife bool) {
	l.fireMu.Lock()
	was := l.fired.Swap(false)
	l.fireMu.Unlock()
	if was || newLife {
		l.onConfirm(newLife)
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
}
