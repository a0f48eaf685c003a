package arborhttp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arborhttp"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

type sseEvent struct {
	id, event, data string
}

// readEvents reads events (and heartbeats, as event "ping") from a stream
// until it ends, sending each on out.
func readEvents(body *bufio.Reader, out chan<- sseEvent) {
	defer close(out)
	var ev sseEvent
	for {
		line, err := body.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == ": ping":
			out <- sseEvent{event: "ping"}
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[6:]
		case line == "" && ev.event != "":
			out <- ev
			ev = sseEvent{}
		}
	}
}

func next(t *testing.T, events <-chan sseEvent) (sseEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-events:
		return ev, ok
	case <-time.After(time.Minute): // the bound of a broken test
		t.Fatal("no event came")
		return sseEvent{}, false
	}
}

// The stream opened before the first message waits for it, sends every
// entry with its Seq as id, resumes after Last-Event-ID, beats while idle,
// and ends after the settle of the task named by until.
func TestStream(t *testing.T) {
	t.Parallel()
	pool, schema := testdb.Shared(t)
	e := enginetest.New(t, pool, &tasks.Config{Schema: schema})
	ctx := t.Context()
	mux := http.NewServeMux()
	mux.Handle("GET /chats/{id}/stream", arborhttp.Stream(e.Engine, func(r *http.Request) (string, error) {
		return r.PathValue("id"), nil
	}, &arborhttp.StreamOptions{Heartbeat: 20 * time.Millisecond}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	conv := testdb.Conversation(t)

	open := func(query string, lastID string) (<-chan sseEvent, func()) {
		rctx, cancel := context.WithCancel(ctx)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, srv.URL+"/chats/"+conv+"/stream"+query, nil)
		require.NoError(t, err)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		events := make(chan sseEvent, 64)
		go readEvents(bufio.NewReader(resp.Body), events)
		return events, func() { cancel(); _ = resp.Body.Close() }
	}
	first, closeFirst := open("", "") // before the conversation exists
	defer closeFirst()
	// A heartbeat while nothing happens.
	ev, _ := next(t, first)
	require.Equal(t, "ping", ev.event)

	turn, _, err := e.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	var created sseEvent
	for created.event != "status" {
		created, _ = next(t, first)
	}
	var entry struct {
		Seq    int64  `json:"seq"`
		TaskID int64  `json:"task_id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(created.data), &entry))
	require.Equal(t, turn.ID, entry.TaskID)
	require.Equal(t, "pending", entry.Status)
	require.Equal(t, fmt.Sprint(entry.Seq), created.id)
	firstSeq := entry.Seq

	// Resumed after the first entry, until the turn settles: the start and
	// the settle, then the end of the stream.
	resumed, closeResumed := open(fmt.Sprintf("?until=%d", turn.ID), created.id)
	defer closeResumed()
	started, err := e.Start(ctx, turn.ID)
	require.NoError(t, err)
	_, err = e.Complete(ctx, turn.ID, started.Token, json.RawMessage(`"done"`))
	require.NoError(t, err)
	var statuses []string
	for {
		ev, ok := next(t, resumed)
		if !ok {
			break
		}
		if ev.event != "status" {
			continue
		}
		require.NoError(t, json.Unmarshal([]byte(ev.data), &entry))
		require.Greater(t, entry.Seq, firstSeq, "only entries after Last-Event-ID")
		statuses = append(statuses, entry.Status)
	}
	require.Equal(t, []string{"running", "completed"}, statuses, "resumed after the create, ended by the settle")

	// Opened with until after the task settled: what is there, then the end.
	late, closeLate := open(fmt.Sprintf("?until=%d", turn.ID), "")
	defer closeLate()
	n := 0
	for {
		ev, ok := next(t, late)
		if !ok {
			break
		}
		if ev.event == "status" {
			n++
		}
	}
	require.Equal(t, 3, n)

	// Bad input is refused before streaming.
	resp, err := http.Get(srv.URL + "/chats/" + conv + "/stream?after=-1")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, err = http.Get(srv.URL + "/chats/" + conv + "/stream?until=424242424")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}
