package arborhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// StreamOptions configure Stream.
type StreamOptions struct {
	// Heartbeat is how often a comment line (": ping") is written while
	// nothing happens, so that proxies keep the connection open and a
	// client that went is noticed. Default 15 s.
	Heartbeat time.Duration
}

// Stream returns an http.Handler that streams a conversation's log as
// server-sent events: every status change of its tasks, the handlers'
// progress and the events, in commit order (tasks.Engine.Follow), each as
//
//	id: <the entry's Seq>
//	event: status | progress | event
//	data: {"seq":…,"task_id":…,"kind":…,"status":…,"name":…,"payload":…,"at":…}
//
// flushed as it commits. conversation names the request's conversation (a
// path value, say); its error is answered as Status answers it. The stream
// resumes after the entry named by the Last-Event-ID header (what an
// EventSource sends when it reconnects) or else the query parameter after
// (a Seq; 0, the default, from the first entry). It may be opened before
// the conversation's first message is posted: it waits for its first
// create. It ends when the client goes, or, with the query parameter until
// (a task's id, the turn the client posted), once that task's settle is
// sent (at once, after the entries up to now, if it has settled already).
// An error while streaming is sent as an "error" event carrying
// {"status":…,"message":…}, and ends it. Authentication is the
// application's: wrap the handler.
func Stream(engine *tasks.Engine, conversation func(*http.Request) (string, error), opts *StreamOptions) http.Handler {
	o := StreamOptions{}
	if opts != nil {
		o = *opts
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 15 * time.Second
	}
	return &stream{engine: engine, conversation: conversation, heartbeat: o.Heartbeat}
}

type stream struct {
	engine       *tasks.Engine
	conversation func(*http.Request) (string, error)
	heartbeat    time.Duration
}

// streamEntry is a log entry as a stream's data.
type streamEntry struct {
	Seq     int64           `json:"seq"`
	TaskID  int64           `json:"task_id,omitempty"`
	Kind    string          `json:"kind"`
	Status  string          `json:"status,omitempty"`
	Name    string          `json:"name,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	At      time.Time       `json:"at"`
}

func (s *stream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fail := func(err error) {
		status, msg := Status(err)
		http.Error(w, msg, status)
	}
	conv, err := s.conversation(r)
	if err != nil {
		fail(err)
		return
	}
	after, until, err := streamCursor(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	settledAlready := false
	if until != 0 {
		t, err := s.engine.Get(ctx, until)
		switch {
		case err != nil:
			fail(err)
			return
		case t.ConversationID != conv:
			fail(fmt.Errorf("task %d is not of the conversation: %w", until, arbortype.ErrNotFound))
			return
		}
		settledAlready = t.Status.Settled()
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	flusher.Flush()

	send := func(en arbortype.LogEntry) error {
		data, err := json.Marshal(streamEntry{Seq: en.Seq, TaskID: en.TaskID, Kind: string(en.Kind), Status: string(en.Status),
			Name: en.Name, Payload: en.Payload, At: en.At})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", en.Seq, en.Kind, data); err != nil {
			return err
		}
		flusher.Flush()
		return nil
	}
	sendError := func(err error) {
		status, msg := Status(err)
		data, _ := json.Marshal(map[string]any{"status": status, "message": msg})
		_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", data)
		flusher.Flush()
	}

	if settledAlready {
		// Up to now, then done: its settle is behind the cursor or among these.
		for {
			entries, err := s.engine.ReadLog(ctx, conv, after, 1000)
			if err != nil {
				sendError(err)
				return
			}
			for _, en := range entries {
				if err := send(en); err != nil {
					return
				}
				after = en.Seq
			}
			if len(entries) < 1000 {
				return
			}
		}
	}

	// Follow writes through entries (unbuffered: it waits for each to be
	// written), so that heartbeats go out between them.
	entries := make(chan arbortype.LogEntry)
	done := make(chan error, 1)
	go func() {
		done <- s.engine.Follow(ctx, conv, after, func(en arbortype.LogEntry) error {
			select {
			case entries <- en:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	beat := time.NewTicker(s.heartbeat)
	defer beat.Stop()
	for {
		select {
		case en := <-entries:
			if err := send(en); err != nil {
				return // the client went
			}
			if until != 0 && en.TaskID == until && en.Terminal() {
				return
			}
		case <-beat.C:
			if _, err := fmt.Fprint(w, ": ping\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) && r.Context().Err() == nil {
				sendError(err)
			}
			return
		case <-r.Context().Done():
			return
		}
	}
}

// streamCursor reads where a stream starts (Last-Event-ID, else the query
// parameter after) and the task it ends with (the query parameter until).
func streamCursor(r *http.Request) (after, until int64, err error) {
	cursor := r.Header.Get("Last-Event-ID")
	if cursor == "" {
		cursor = r.URL.Query().Get("after")
	}
	if cursor != "" {
		if after, err = strconv.ParseInt(cursor, 10, 64); err != nil || after < 0 {
			return 0, 0, fmt.Errorf("after %q: not a seq", cursor)
		}
	}
	if u := r.URL.Query().Get("until"); u != "" {
		if until, err = strconv.ParseInt(u, 10, 64); err != nil || until <= 0 {
			return 0, 0, fmt.Errorf("until %q: not a task id", u)
		}
	}
	return after, until, nil
}
