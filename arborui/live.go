package arborui

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// keepAlive is how often an idle live stream sends a comment, so that a
// proxy between the browser and the handler does not close it for silence.
const keepAlive = 15 * time.Second

// conversationLive streams a conversation's tree: the fragment at once,
// then again after every change to the conversation's log.
func (h *handler) conversationLive(w http.ResponseWriter, r *http.Request) {
	conv := r.URL.Query().Get("id")
	if conv == "" {
		h.errPage(w, r, badRequest("no conversation: the address needs ?id=CONVERSATION"))
		return
	}
	h.live(w, r, conv, func(ctx context.Context) (string, any, error) {
		v, err := h.treeView(ctx, conv)
		return "tree", v, err
	})
}

// taskLive streams a task's record, re-rendered after every change to its
// conversation's log.
func (h *handler) taskLive(w http.ResponseWriter, r *http.Request) {
	id, err := taskID(r)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	t, err := h.engine.Get(r.Context(), id)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	h.live(w, r, t.ConversationID, func(ctx context.Context) (string, any, error) {
		v, err := h.record(ctx, id)
		return "record", v, err
	})
}

// live serves a server-sent event stream of fragments of conv: one at once,
// then one after each commit to conv's log (news that comes while a
// fragment is rendered is folded into the next). It follows the log through
// Engine.Follow, so every stream of an Engine shares its one LISTEN. The
// cursor is taken before the first fragment is read: a commit after that
// read is after the cursor, and brings a new fragment.
func (h *handler) live(w http.ResponseWriter, r *http.Request, conv string, view func(context.Context) (string, any, error)) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if _, err := h.engine.Conversation(ctx, conv); err != nil {
		h.errPage(w, r, err)
		return
	}
	head, err := h.engine.LogHead(ctx, conv)
	if err != nil {
		h.errPage(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Accel-Buffering", "no") // nginx: do not hold the stream back
	w.WriteHeader(http.StatusOK)

	news := make(chan struct{}, 1)
	followed := make(chan error, 1)
	go func() {
		followed <- h.engine.Follow(ctx, conv, head, func(arbortype.LogEntry) error {
			select {
			case news <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for fresh := true; ; {
		if fresh {
			name, v, err := view(ctx)
			if err != nil {
				if ctx.Err() == nil {
					h.opts.Logger.Warn("arborui: live view failed", "conversation", conv, "error", err)
					_ = sendEvent(w, "failed", "the view could not be read")
					_ = rc.Flush()
				}
				return
			}
			var buf bytes.Buffer
			if err := h.tmpl.ExecuteTemplate(&buf, name, v); err != nil {
				h.opts.Logger.Error("arborui: render failed", "template", name, "error", err)
				return
			}
			if sendEvent(w, "fragment", string(scrub(buf.Bytes()))) != nil || rc.Flush() != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case err := <-followed:
			if !errors.Is(err, context.Canceled) {
				h.opts.Logger.Warn("arborui: following the log failed", "conversation", conv, "error", err)
			}
			return
		case <-news:
			fresh = true
		case <-tick.C:
			fresh = false
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// sendEvent writes one server-sent event; every line of data is a data
// line of its own, as the format requires. data is HTML: a carriage return
// in it (one of the task's own data, which the format would read as a line
// end) is sent as its character reference, which means the same.
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
