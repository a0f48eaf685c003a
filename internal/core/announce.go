package core

import (
	"context"
	"slices"
	"sync"
	"time"
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

// announceTimeout bounds one send.
const announceTimeout = 5 * time.Second

type announcer struct {
	mu      sync.Mutex
	pending map[string][]string // by channel
	sending bool
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
			if err := e.Store.Announce(ctx, e.Pool, channel, convs); err != nil {
				e.Logger.Debug("arbor: announcing changes failed; listeners find them at their next poll", "conversations", len(convs), "error", err.Error())
			}
		}
		cancel()
	}
}
