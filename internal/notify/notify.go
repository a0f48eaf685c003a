// Package notify is a process's one LISTEN connection per pool: the
// runner's change channel, the waker's sleep channel and the followers of
// tasks.Engine (Follow, AwaitSettled) subscribe to the channels they need
// and share one backend, instead of each holding a connection of its own.
//
// A Listener exists for a pool while it has subscriptions. Its connection
// is acquired from the pool and hijacked (the pool replaces it, so the
// LISTEN holds no slot of the pool's). It LISTENs on the union of its
// subscriptions' channels: a subscription that adds a channel interrupts
// the wait for notifications (pgx's deadline, which leaves the connection
// usable), and the LISTEN is sent on the same connection.
//
// No lost wake-up: a notification sent while nobody listened is never
// heard, so each subscription's onListen is called once its channels are
// all LISTENed on a connection, and again after every reconnect; the
// subscriber polls then for what it missed. A lost connection is retried
// at once after it had listened, with backoff (10 ms doubling to 5 s)
// while it fails before listening.
//
// Locking: Listener.mu guards the subscriptions and the wanted channels;
// it is never held while a callback runs nor while the connection is used.
// Subscription.mu is held while its callbacks run, so that Unsubscribe,
// which takes it after removing the subscription, returns only once no
// callback of it runs and none will. The order is registry.mu, then
// Listener.mu; Subscription.mu is never taken under either. Callbacks run
// on the listener's goroutine, one at a time: they must be brief and must
// not call Unsubscribe.
package notify

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Listener is the LISTEN connection of one pool (see the package doc).
type Listener struct {
	pool   *pgxpool.Pool
	logger *slog.Logger

	mu     sync.Mutex
	subs   map[*Subscription]bool
	want   map[string]int // channel → its subscriptions
	change chan struct{}  // the wanted channels changed (buffer 1)
	cancel context.CancelFunc
	done   chan struct{}
}

// Subscription is one subscriber's interest in some channels of a
// Listener's pool.
type Subscription struct {
	l        *Listener
	channels []string
	onListen func()
	onNotify func(*pgconn.Notification)

	mu     sync.Mutex // held while its callbacks run
	closed bool
}

var registry struct {
	mu sync.Mutex
	m  map[*pgxpool.Pool]*Listener
}

// Subscribe registers onNotify for the notifications of channels on pool's
// listener, starting it if it is the pool's first subscription. onListen is
// called once the channels are LISTENed, and after each reconnect (poll
// then: what was sent meanwhile was not heard). It returns at once;
// Unsubscribe ends the subscription. logger reports lost connections (the
// first subscriber's is the listener's).
func Subscribe(pool *pgxpool.Pool, logger *slog.Logger, channels []string, onListen func(), onNotify func(*pgconn.Notification)) *Subscription {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.m == nil {
		registry.m = map[*pgxpool.Pool]*Listener{}
	}
	l := registry.m[pool]
	if l == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l = &Listener{pool: pool, logger: logger, subs: map[*Subscription]bool{}, want: map[string]int{},
			change: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
		registry.m[pool] = l
		go l.run(ctx)
	}
	s := &Subscription{l: l, channels: slices.Clone(channels), onListen: onListen, onNotify: onNotify}
	l.mu.Lock()
	l.subs[s] = true
	for _, ch := range s.channels {
		l.want[ch]++
	}
	l.mu.Unlock()
	l.changed()
	return s
}

// Unsubscribe ends s: when it returns, no callback of s runs nor will. The
// listener stops, and closes its connection, with its last subscription.
func (s *Subscription) Unsubscribe() {
	l := s.l
	registry.mu.Lock()
	l.mu.Lock()
	last := false
	if l.subs[s] {
		delete(l.subs, s)
		for _, ch := range s.channels {
			if l.want[ch]--; l.want[ch] == 0 {
				delete(l.want, ch)
			}
		}
		if len(l.subs) == 0 {
			last = true
			delete(registry.m, l.pool)
		}
	}
	l.mu.Unlock()
	registry.mu.Unlock()
	l.changed()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if last {
		l.cancel()
		<-l.done
	}
}

func (l *Listener) changed() {
	select {
	case l.change <- struct{}{}:
	default:
	}
}

// run keeps a connection LISTENing until ctx ends (see nextRetry).
func (l *Listener) run(ctx context.Context) {
	defer close(l.done)
	var retry time.Duration
	for ctx.Err() == nil {
		listened, err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		retry = nextRetry(retry, listened)
		l.logger.WarnContext(ctx, "arbor: the LISTEN connection was lost; retrying", slog.String("error", fmt.Sprint(err)),
			slog.Duration("in", retry))
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// nextRetry is the wait before the next connection after one that failed,
// given the last wait and whether that one had listened: a connection that
// listened and was then lost (a failover, an idle timeout) is tried again
// at once and backs off from 10 ms anew; attempts that fail before
// listening double the wait, to at most 5 s.
func nextRetry(last time.Duration, listened bool) time.Duration {
	if listened || last == 0 {
		return 10 * time.Millisecond
	}
	return min(2*last, 5*time.Second)
}

// session LISTENs on one connection until it fails; listened says whether
// it got as far as LISTENing.
func (l *Listener) session(ctx context.Context) (listened bool, err error) {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// The session waits for notifications idle, outside any transaction: a
	// role's idle_session_timeout would end it each time, and every
	// reconnect misses what was sent meanwhile. The connection never goes
	// back to the pool, so the setting ends with it.
	if _, err := conn.Exec(ctx, "SET idle_session_timeout = 0"); err != nil {
		return false, err
	}
	on := map[string]bool{}
	told := map[*Subscription]bool{}
	for {
		// Drain the change signal before reading what is wanted: a change
		// after the read signals again.
		select {
		case <-l.change:
		default:
		}
		l.mu.Lock()
		want := make([]string, 0, len(l.want))
		for ch := range l.want {
			want = append(want, ch)
		}
		l.mu.Unlock()
		for _, ch := range want {
			if !on[ch] {
				if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
					return listened, err
				}
				on[ch] = true
			}
		}
		for ch := range on {
			if !slices.Contains(want, ch) {
				if _, err := conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
					return listened, err
				}
				delete(on, ch)
			}
		}
		listened = true
		l.mu.Lock()
		var tell []*Subscription
		for s := range l.subs {
			if !told[s] && allOn(s.channels, on) {
				told[s] = true
				tell = append(tell, s)
			}
		}
		for s := range told {
			if !l.subs[s] {
				delete(told, s)
			}
		}
		l.mu.Unlock()
		for _, s := range tell {
			s.call(func() { s.onListen() })
		}

		n, err := l.wait(ctx, conn)
		if err != nil {
			if ctx.Err() != nil || conn.IsClosed() {
				return listened, err
			}
			if n == nil {
				continue // interrupted by a change of the wanted channels
			}
		}
		if n == nil {
			continue
		}
		l.mu.Lock()
		var to []*Subscription
		for s := range l.subs {
			if slices.Contains(s.channels, n.Channel) {
				to = append(to, s)
			}
		}
		l.mu.Unlock()
		for _, s := range to {
			s.call(func() { s.onNotify(n) })
		}
	}
}

// wait waits for a notification until one comes, ctx ends or the wanted
// channels change (nil, nil then, or the deadline's error on a usable
// connection).
func (l *Listener) wait(ctx context.Context, conn *pgx.Conn) (*pgconn.Notification, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-l.change:
			l.changed() // the loop drains it before reading the wanted channels
			cancel()
		case <-stop:
		}
	}()
	n, err := conn.WaitForNotification(wctx)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		return nil, nil
	}
	return n, err
}

func (s *Subscription) call(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		fn()
	}
}

func allOn(channels []string, on map[string]bool) bool {
	for _, ch := range channels {
		if !on[ch] {
			return false
		}
	}
	return true
}
