package tasks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/notify"
	"github.com/arborhq/arbor/internal/store"
)

// The conversation log, and following it.
//
// Every status change of every task, every handler's progress and every
// event of a conversation is an entry of its log, numbered (Seq) in the
// order they committed: the writers of a conversation's log all hold its
// row. A follower reads the entries after its cursor, then waits for news:
// one LISTEN connection per Engine serves all its followers, for as long as
// any follows (it names the conversations whose logs grew), with a slow
// poll behind it for a notification missed.

// FollowPoll is how often a follower reads its log when no notification
// came: the bound on its latency when one is lost.
const FollowPoll = time.Second

// ReadLog reads up to limit (1..10,000) entries of a conversation's log
// after seq after (0: from the start), in order. An unknown conversation
// (never created, or pruned whole) is arbortype.ErrNotFound.
func (e *Engine) ReadLog(ctx context.Context, conversationID string, after int64, limit int) ([]arbortype.LogEntry, error) {
	entries, err := core.Read(ctx, e.core, func(db store.DB) ([]store.LogEntry, error) {
		return e.core.ReadLog(ctx, db, conversationID, after, limit)
	})
	if err != nil {
		return nil, err
	}
	out := make([]arbortype.LogEntry, len(entries))
	for i, en := range entries {
		out[i] = arbortype.LogEntry(en)
	}
	return out, nil
}

// LogHead returns the seq of the last entry of a conversation's log (0
// when it has none): a cursor to follow what comes next. An unknown
// conversation is arbortype.ErrNotFound.
func (e *Engine) LogHead(ctx context.Context, conversationID string) (int64, error) {
	return core.Read(ctx, e.core, func(db store.DB) (int64, error) {
		if _, err := e.core.ReadLog(ctx, db, conversationID, 0, 1); err != nil {
			return 0, err
		}
		return e.core.Store.LogHead(ctx, db, conversationID)
	})
}

// Follow calls fn with every entry of a conversation's log after seq after,
// in order, then with each new one as it commits, until ctx ends (it
// returns ctx's error) or fn returns an error (Follow returns it). A
// follower that attaches mid-turn with the cursor of the last entry it saw
// misses nothing: every later entry, the turn's settle included, comes. A
// conversation that does not exist yet is waited for: a client may open
// its stream before it posts the first message, and the follow starts
// with the conversation's first entries when its first create commits (it
// is not created by following it). One pruned whole while it is followed
// ends the follow with arbortype.ErrNotFound; a malformed id is
// arbortype.ErrInvalidArgument at once.
func (e *Engine) Follow(ctx context.Context, conversationID string, after int64, fn func(arbortype.LogEntry) error) error {
	return e.follow(ctx, conversationID, after, false, fn)
}

// follow is Follow; with exists, the conversation existed when the caller
// read it: not finding it is its prune, ErrNotFound at once.
func (e *Engine) follow(ctx context.Context, conversationID string, after int64, exists bool, fn func(arbortype.LogEntry) error) error {
	if _, err := e.ReadLog(ctx, conversationID, after, 1); err != nil && (exists || !errors.Is(err, arbortype.ErrNotFound)) {
		return err
	}
	// Subscribed before the conversation is read again: its creation's
	// notice, or any later entry's, cannot fall between the read and the
	// wait.
	sub, err := e.hub.subscribe(ctx, conversationID)
	if err != nil {
		return err
	}
	defer e.hub.unsubscribe(sub)
	poll := time.NewTimer(FollowPoll)
	defer poll.Stop()
	seen := exists // the conversation existed once: its disappearance is a prune
	for {
		entries, err := e.ReadLog(ctx, conversationID, after, 1000)
		switch {
		case errors.Is(err, arbortype.ErrNotFound) && !seen:
			entries = nil // not created yet: wait for it
		case err != nil:
			return err
		default:
			seen = true
		}
		for _, en := range entries {
			if err := fn(en); err != nil {
				return err
			}
			after = en.Seq
		}
		if len(entries) == 1000 {
			continue
		}
		poll.Reset(FollowPoll)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.news:
		case <-poll.C:
		}
	}
}

// errSettled ends AwaitSettled's Follow.
var errSettled = errors.New("settled")

// AwaitSettled returns taskID once it has settled, within milliseconds of
// the commit that settled it, from any process, following its
// conversation's log (no busy polling); at once if it has already. It
// returns only a task whose row is settled: a settle's log entry sends it
// to read the row, and an entry the row does not bear out (one written
// into the log by hand) is passed over. (Behind
// a transaction-mode pooler with no Config.ListenPool it polls: within
// FollowPoll.) ctx
// bounds the wait. An unknown task is arbortype.ErrNotFound.
func (e *Engine) AwaitSettled(ctx context.Context, taskID int64) (arbortype.Task, error) {
	t, err := e.Get(ctx, taskID)
	if err != nil || t.Status.Settled() {
		return t, err
	}
	// The cursor is read after the task: a settle after the read above is
	// in the log after the cursor, or the task is settled already.
	head, err := e.LogHead(ctx, t.ConversationID)
	if err != nil {
		return arbortype.Task{}, err
	}
	if t, err = e.Get(ctx, taskID); err != nil || t.Status.Settled() {
		return t, err
	}
	// A settle's entry is the news, the task's row the answer: an entry
	// written behind the engine's back (the log is a plain table) may say
	// the task settled while its row says it runs, and the row decides.
	err = e.follow(ctx, t.ConversationID, head, true, func(en arbortype.LogEntry) error {
		if en.TaskID != taskID || !en.Terminal() {
			return nil
		}
		got, err := e.Get(ctx, taskID)
		if err != nil {
			return err
		}
		if !got.Status.Settled() {
			return nil
		}
		t = got
		return errSettled
	})
	if !errors.Is(err, errSettled) {
		return arbortype.Task{}, fmt.Errorf("await task %d: %w", taskID, err)
	}
	return t, nil
}

// hub is the Engine's followers' subscription to the process's one
// listener of its pool (internal/notify, shared with a Runner's): it is
// subscribed while any follower is, and pokes the followers of the
// conversation each notification names; every follower after each
// (re)subscription, since what committed meanwhile was not heard.
type hub struct {
	core *core.Engine

	mu    sync.Mutex
	subs  map[string]map[*subscriber]bool
	n     int
	sub   *notify.Subscription
	ready chan struct{}
}

type subscriber struct {
	conv string
	news chan struct{}
}

func newHub(c *core.Engine) *hub { return &hub{core: c, subs: map[string]map[*subscriber]bool{}} }

// subscribe registers a follower of conv, starting the listener if it is
// the first; it returns once the listener LISTENs, so that nothing that
// commits after it is unheard.
func (h *hub) subscribe(ctx context.Context, conv string) (*subscriber, error) {
	s := &subscriber{conv: conv, news: make(chan struct{}, 1)}
	pool := h.core.Listener()
	h.mu.Lock()
	if h.subs[conv] == nil {
		h.subs[conv] = map[*subscriber]bool{}
	}
	h.subs[conv][s] = true
	h.n++
	if pool == nil {
		// Behind a pooler with no ListenPool: nothing to LISTEN on, the
		// follower polls (FollowPoll).
		h.mu.Unlock()
		return s, nil
	}
	if h.n == 1 {
		ready := make(chan struct{})
		once := sync.OnceFunc(func() { close(ready) })
		h.ready = ready
		h.sub = notify.Subscribe(pool, h.core.Logger, []string{h.core.Store.ChangeChannel(), h.core.Store.LogChannel()},
			func() { once(); h.pokeAll() },
			func(n *pgconn.Notification) { h.poke(n.Payload) })
	}
	ready := h.ready
	h.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		h.unsubscribe(s)
		return nil, ctx.Err()
	case <-time.After(FollowPoll):
		// The listener is not up yet (the database is slow to answer): the
		// follower polls meanwhile.
	}
	return s, nil
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs[s.conv], s)
	if len(h.subs[s.conv]) == 0 {
		delete(h.subs, s.conv)
	}
	h.n--
	var sub *notify.Subscription
	if h.n == 0 {
		sub, h.sub = h.sub, nil
	}
	h.mu.Unlock()
	if sub != nil {
		sub.Unsubscribe()
	}
}

func (h *hub) poke(conv string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs[conv] {
		select {
		case s.news <- struct{}{}:
		default:
		}
	}
}

func (h *hub) pokeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ss := range h.subs {
		for s := range ss {
			select {
			case s.news <- struct{}{}:
			default:
			}
		}
	}
}
