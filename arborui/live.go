package arborui

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// The live streams: server-sent events of fragments rendered on the
// server, which the page's small script swaps in (or, for a log, adds).
//
// What a stream holds and sends is bounded: it holds one fragment at a
// time, and every fragment is a bounded page (a tree of at most
// Options.TreeLimit tasks, a log of at most logShown entries with their
// payloads cut, a list of one page); between two fragments it waits at
// least minGap, and longer after a fragment that was slow to read, so
// that a busy conversation costs each viewer a bounded share of the
// database. The streams of one conversation share one follower of its
// log (watches), however many pages show it.

// keepAlive is how often an idle live stream sends a comment, so that a
// proxy between the browser and the handler does not close it for silence.
const keepAlive = 15 * time.Second

// minGap is the least time between two fragments of a stream: news that
// comes sooner is folded into the next.
const minGap = 20 * time.Millisecond

// stream is what a live stream sends: render writes the next event's
// fragment (name: "fragment" to replace the element's content, "append"
// to add to it; skip: nothing to send this time).
type stream struct {
	// conv is the conversation whose log news triggers a render; "" for
	// a stream that polls instead.
	conv string
	// poll, for a stream without conv, says whether to render now (every
	// Options.Refresh); nil renders every time.
	poll   func(ctx context.Context) (bool, error)
	render func(ctx context.Context, buf *bytes.Buffer) (name string, skip bool, err error)
}

// serve runs s until the request ends: a fragment at once, then one after
// each change (each poll that says so).
//
// The first fragment is read before the answer's status is written: a
// request the page would refuse — a cursor that is not one, an unknown
// task or conversation — is refused the same way, with its 4xx and
// error page, and the browser's EventSource stops there. Once streaming,
// or when the first read fails for the database (5xx), a failure is a
// "failed" event, and the browser reconnects: that is what a fault that
// passes needs, and a reconnect after the request went bad meanwhile (its
// task pruned) is then refused with its 4xx.
func (h *handler) serve(w http.ResponseWriter, r *http.Request, s stream) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	rc := http.NewResponseController(w)
	streaming := false
	start := func() {
		hdr := w.Header()
		hdr.Set("Content-Type", "text/event-stream")
		hdr.Set("Cache-Control", "no-store")
		hdr.Set("X-Accel-Buffering", "no") // nginx: do not hold the stream back
		w.WriteHeader(http.StatusOK)
		streaming = true
	}
	fail := func(err error) {
		if !streaming && statusOf(err) < 500 {
			h.errPage(w, r, err)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if !streaming {
			start()
		}
		h.opts.Logger.Warn("arborui: live view failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		_ = sendEvent(w, "failed", "the view could not be read; reconnecting")
		_ = rc.Flush()
	}
	var news <-chan struct{}
	if s.conv != "" {
		if _, err := h.engine.Conversation(ctx, s.conv); err != nil {
			fail(err)
			return
		}
		sub, err := h.watches.subscribe(ctx, s.conv)
		if err != nil {
			fail(err)
			return
		}
		defer h.watches.unsubscribe(sub)
		news = sub.news
	}

	var (
		poll <-chan time.Time
		buf  bytes.Buffer
	)
	if news == nil {
		t := time.NewTicker(h.opts.Refresh)
		defer t.Stop()
		poll = t.C
	}
	alive := time.NewTicker(keepAlive)
	defer alive.Stop()
	for fresh := true; ; {
		if fresh {
			began := time.Now()
			buf.Reset()
			name, skip, err := s.render(ctx, &buf)
			if err != nil {
				fail(err)
				return
			}
			if !streaming {
				start()
			}
			if !skip {
				if sendEvent(w, name, string(scrub(buf.Bytes()))) != nil || rc.Flush() != nil {
					return
				}
			} else if rc.Flush() != nil {
				return
			}
			// The next fragment no sooner than minGap, nor than twice what
			// this one took to read and render.
			gap := max(minGap, 2*time.Since(began))
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
			if buf.Cap() > 4<<20 {
				buf = bytes.Buffer{} // a rare large fragment is not held
			}
		}
		fresh = false
		select {
		case <-ctx.Done():
			return
		case _, ok := <-news:
			if !ok {
				fail(errors.New("the log's follower stopped"))
				return
			}
			fresh = true
		case <-poll:
			if s.poll == nil {
				fresh = true
				continue
			}
			changed, err := s.poll(ctx)
			if err != nil {
				fail(err)
				return
			}
			fresh = changed
		case <-alive.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// sendEvent writes one server-sent event; every line of data is a data
// line of its own, as the format requires. data is HTML: a carriage return
// in it (which the format would read as a line end; scrub has replaced
// those of data already) is sent as its character reference.
func sendEvent(w http.ResponseWriter, name, data string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "event: %s\n", name)
	for line := range strings.SplitSeq(strings.ReplaceAll(data, "\r", "&#13;"), "\n") {
		fmt.Fprintf(&b, "data: %s\n", line)
	}
	b.WriteString("\n")
	_, err := fmt.Fprint(w, b.String())
	return err
}

// watches are the handler's followers of conversation logs: one per
// conversation that any stream shows, shared by all of them, started by
// the first and stopped with the last. (Each is an Engine.Follow, and
// the Engine's followers share one LISTEN.)
type watches struct {
	engine *tasks.Engine
	logger *slog.Logger

	mu sync.Mutex
	m  map[string]*watch
}

type watch struct {
	subs   map[*subscription]bool
	cancel context.CancelFunc
	// ready is closed once the follower has read the log's head: a
	// subscriber renders after it, so that every commit it does not see
	// comes as news.
	ready chan struct{}
	err   error // why it stopped before it was ready
}

type subscription struct {
	conv string
	news chan struct{}
}

func newWatches(engine *tasks.Engine, logger *slog.Logger) *watches {
	return &watches{engine: engine, logger: logger, m: map[string]*watch{}}
}

// subscribe returns a subscription to conv's news: its channel receives
// (at most one waiting) after each commit to conv's log from the return
// on, and is closed if the follower stops.
func (ws *watches) subscribe(ctx context.Context, conv string) (*subscription, error) {
	s := &subscription{conv: conv, news: make(chan struct{}, 1)}
	ws.mu.Lock()
	w := ws.m[conv]
	if w == nil {
		wctx, cancel := context.WithCancel(context.Background())
		w = &watch{subs: map[*subscription]bool{}, cancel: cancel, ready: make(chan struct{})}
		ws.m[conv] = w
		go ws.follow(wctx, conv, w)
	}
	w.subs[s] = true
	ws.mu.Unlock()
	select {
	case <-w.ready:
	case <-ctx.Done():
		ws.unsubscribe(s)
		return nil, ctx.Err()
	}
	if w.err != nil {
		ws.unsubscribe(s)
		return nil, w.err
	}
	return s, nil
}

func (ws *watches) unsubscribe(s *subscription) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[s.conv]
	if w == nil || !w.subs[s] {
		return
	}
	delete(w.subs, s)
	if len(w.subs) == 0 {
		w.cancel()
		delete(ws.m, s.conv)
	}
}

// follow runs conv's follower until its last subscriber leaves (or the
// log cannot be read: then every subscription is closed, and the
// browsers reconnect).
func (ws *watches) follow(ctx context.Context, conv string, w *watch) {
	head, err := ws.engine.LogHead(ctx, conv)
	if err != nil {
		w.err = err
		close(w.ready)
		ws.drop(conv, w)
		return
	}
	close(w.ready)
	err = ws.engine.Follow(ctx, conv, head, func(arbortype.LogEntry) error {
		ws.mu.Lock()
		for s := range w.subs {
			select {
			case s.news <- struct{}{}:
			default:
			}
		}
		ws.mu.Unlock()
		return nil
	})
	if ctx.Err() == nil {
		ws.logger.Warn("arborui: following the log failed", slog.String("conversation", conv), slog.Any("error", err))
	}
	ws.drop(conv, w)
}

// drop removes w, if it is still conv's, and closes its subscriptions.
func (ws *watches) drop(conv string, w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m[conv] == w {
		delete(ws.m, conv)
	}
	for s := range w.subs {
		close(s.news)
		delete(w.subs, s)
	}
	w.cancel()
}
