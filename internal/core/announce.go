package core

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Announcing a change after its commit, coalesced.
//
// A transaction that executes NOTIFY takes a database-wide lock at commit
// and keeps it through the commit's WAL flush, so transactions that notify
// commit one at a time: a NOTIFY in every one-statement Create would make
// every Create wait for every other's flush (measured: half the
// throughput). The one-statement Create therefore announces its
// conversation after its commit instead, through an announcer: the
// conversations to announce are queued, and one short-lived goroutine sends
// everything queued in one statement (one NOTIFY-ing commit for many), then
// what was queued meanwhile, and ends when the queue is empty. An
// announcement lost (the process died between the commit and the send, or
// the send failed) costs a runner one PollInterval: runners also poll.
//
// The sender takes a connection for each send. From a pool that is busy or
// growing, that wait is what a follower waits for: measured in bench (i)'s
// stream (a handler's Run.Progress, then a follower), a runner's
// announcements waited 90–235 ms for the runner's work pool to open a
// connection, while the pool had connections free to open (p99 126–140
// ms at 200 progress entries). So a runner gives its engine an announcer of
// its own, on a connection kept open for it alone (WithAnnouncePool).

// announceTimeout bounds one send.
const announceTimeout = 5 * time.Second

type announcer struct {
	// pool, when not nil, is the announcer's own (a runner's announce
	// connection); nil sends on the engine's pool.
	pool    *pgxpool.Pool
	mu      sync.Mutex
	pending map[string][]string // by channel
	sending bool
}

// WithAnnouncePool returns the engine with an announcer of its own, which
// sends on pool: the announcements of its one-statement writes (and its
// AnnounceLog) wait for no connection of the engine's pool.
func (e *Engine) WithAnnouncePool(pool *pgxpool.Pool) *Engine {
	c := *e
	c.announcer = &announcer{pool: pool}
	return &c
}

// announce queues conv to be announced on the change channel, and starts a
// sender unless one runs.
func (e *Engine) announce(conv string) { e.announceOn(e.Store.ChangeChannel(), conv) }

// AnnounceLog queues the conversations whose log grew in a transaction that
// did not announce them (a runner's batch), for the log's followers.
func (e *Engine) AnnounceLog(convs ...string) {
	for _, c := range convs {
		e.announceOn(e.Store.LogChannel(), c)
	}
}

func (e *Engine) announceOn(channel, conv string) {
	a := e.announcer
	a.mu.Lock()
	if a.pending == nil {
		a.pending = map[string][]string{}
	}
	a.pending[channel] = append(a.pending[channel], conv)
	if a.sending {
		a.mu.Unlock()
		return
	}
	a.sending = true
	a.mu.Unlock()
	go e.sendAnnouncements()
}

func (e *Engine) sendAnnouncements() {
	a := e.announcer
	pool := a.pool
	if pool == nil {
		pool = e.Pool
	}
	for {
		a.mu.Lock()
		batch := a.pending
		a.pending = nil
		if len(batch) == 0 {
			a.sending = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), announceTimeout)
		for channel, convs := range batch {
			slices.Sort(convs)
			convs = slices.Compact(convs)
			if err := e.Store.Announce(ctx, pool, channel, convs); err != nil {
				e.Logger.Debug("arbor: announcing changes failed; listeners find them at their next poll", "conversations", len(convs), "error", err.Error())
			}
		}
		cancel()
	}
}
