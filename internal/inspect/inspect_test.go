package inspect_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/inspect"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// inspectFixture is a schema of its own with n conversations named
// prefix-000…: every third has a failed task, every fifth one awaiting an
// event, every seventh one running (held by the test's lease holder); every
// fourth is of tenant "acme", the others of the default tenant.
type inspectFixture struct {
	ctx     context.Context
	engine  *enginetest.Engine
	reader  *inspect.Reader
	prefix  string
	ids     []string
	failed  map[string]bool
	await   map[string]bool
	running map[string]bool
}

func newInspectFixture(t *testing.T, n int) *inspectFixture {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	f := &inspectFixture{ctx: context.Background(), engine: enginetest.New(t, pool, &tasks.Config{Schema: schema}),
		prefix: testdb.Name("c"), failed: map[string]bool{}, await: map[string]bool{}, running: map[string]bool{}}
	f.reader = inspect.New(f.engine.Engine)
	var ps []arbortype.CreateParams
	for i := range n {
		id := fmt.Sprintf("%s-%03d", f.prefix, i)
		f.ids = append(f.ids, id)
		kind := "turn"
		if i%2 == 1 {
			kind = "odd_turn"
		}
		tenant := ""
		if i%4 == 0 {
			tenant = "acme"
		}
		ps = append(ps, arbortype.CreateParams{ConversationID: id, Kind: kind, Tenant: tenant})
	}
	roots, _, err := f.engine.CreateMany(f.ctx, ps)
	require.NoError(t, err)
	for i, root := range roots {
		id := f.ids[i]
		switch {
		case i%3 == 0:
			run, err := f.engine.Start(f.ctx, root.ID)
			require.NoError(t, err)
			_, err = f.engine.Fail(f.ctx, root.ID, run.Token, arbortype.TaskError{Message: "boom", NonRetryable: true})
			require.NoError(t, err)
			f.failed[id] = true
		case i%5 == 0:
			run, err := f.engine.Start(f.ctx, root.ID)
			require.NoError(t, err)
			_, err = f.engine.AwaitEvent(f.ctx, root.ID, run.Token, core.AwaitParams{Name: "approval"})
			require.NoError(t, err)
			f.await[id] = true
		case i%7 == 0:
			_, err := f.engine.Start(f.ctx, root.ID)
			require.NoError(t, err)
			f.running[id] = true
		}
	}
	return f
}

func ptr[T any](v T) *T { return &v }

// all pages through q and returns the ids listed, failing on one listed
// twice, and on a row whose tenant is not its conversation's.
func (f *inspectFixture) all(t *testing.T, q inspect.ConversationQuery) []string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	for pages := 0; ; pages++ {
		require.Less(t, pages, 1000, "the listing ends")
		page, err := f.reader.QueryConversations(f.ctx, q)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Conversations), q.Limit)
		for _, c := range page.Conversations {
			require.False(t, seen[c.ID], "%s listed twice", c.ID)
			i := slices.Index(f.ids, c.ID)
			require.Equal(t, i%4 == 0, c.Tenant == "acme", "%s's tenant %q", c.ID, c.Tenant)
			seen[c.ID] = true
			out = append(out, c.ID)
		}
		if page.Next == "" {
			return out
		}
		q.Cursor = page.Next
	}
}

// TestQueryConversations: every order and filter lists exactly the
// conversations it keeps, each once, across pages whose scans are
// smaller than the listing, in its order.
func TestQueryConversations(t *testing.T) {
	t.Parallel()
	f := newInspectFixture(t, 120)
	keep := func(pred func(i int, id string) bool) []string {
		var out []string
		for i, id := range f.ids {
			if pred(i, id) {
				out = append(out, id)
			}
		}
		return out
	}
	cases := map[string]struct {
		q    inspect.ConversationQuery
		want []string
	}{
		"all":      {inspect.ConversationQuery{}, f.ids},
		"failed":   {inspect.ConversationQuery{Failed: true}, keep(func(_ int, id string) bool { return f.failed[id] })},
		"awaiting": {inspect.ConversationQuery{Awaiting: true}, keep(func(_ int, id string) bool { return f.await[id] })},
		"running": {inspect.ConversationQuery{Statuses: []arbortype.Status{arbortype.StatusRunning}},
			keep(func(_ int, id string) bool { return f.running[id] })},
		"live": {inspect.ConversationQuery{Live: inspect.LiveOnly}, keep(func(_ int, id string) bool { return !f.failed[id] })},
		"settled": {inspect.ConversationQuery{Live: inspect.LiveNone},
			keep(func(_ int, id string) bool { return f.failed[id] })},
		"kind":   {inspect.ConversationQuery{Kind: "odd_turn"}, keep(func(i int, _ string) bool { return i%2 == 1 })},
		"holder": {inspect.ConversationQuery{Holder: "test"}, keep(func(_ int, id string) bool { return f.failed[id] || f.await[id] || f.running[id] })},
		"prefix": {inspect.ConversationQuery{Prefix: f.prefix + "-01"}, keep(func(_ int, id string) bool { return strings.HasPrefix(id, f.prefix+"-01") })},
		"combined": {inspect.ConversationQuery{Kind: "odd_turn", Failed: true},
			keep(func(i int, id string) bool { return i%2 == 1 && f.failed[id] })},
		"tenant":         {inspect.ConversationQuery{Tenant: ptr("acme")}, keep(func(i int, _ string) bool { return i%4 == 0 })},
		"default tenant": {inspect.ConversationQuery{Tenant: ptr("")}, keep(func(i int, _ string) bool { return i%4 != 0 })},
		"no such tenant": {inspect.ConversationQuery{Tenant: ptr("nobody")}, nil},
	}
	for name, c := range cases {
		for _, order := range []inspect.ConversationOrder{inspect.OrderID, inspect.OrderRecent} {
			t.Run(fmt.Sprintf("%s by %q", name, order), func(t *testing.T) {
				t.Parallel()
				q := c.q
				q.Order, q.Limit, q.Scan = order, 7, 11
				got := f.all(t, q)
				want := slices.Clone(c.want)
				if order == inspect.OrderRecent {
					slices.Reverse(want) // created in id order: the newest last
				}
				require.Equal(t, want, got)
			})
		}
	}
	t.Run("a page's rows", func(t *testing.T) {
		t.Parallel()
		page, err := f.reader.QueryConversations(f.ctx, inspect.ConversationQuery{Order: inspect.OrderID, Limit: 3})
		require.NoError(t, err)
		require.Len(t, page.Conversations, 3)
		c := page.Conversations[0]
		require.Equal(t, f.ids[0], c.ID)
		require.True(t, c.Failed)
		require.Equal(t, "turn", c.LastKind)
		require.Equal(t, arbortype.StatusFailed, c.LastStatus)
		require.Empty(t, c.Live)
		require.Equal(t, 1, page.Conversations[1].Live[arbortype.StatusPending])
		require.False(t, page.Partial)
		require.NotEmpty(t, page.Next)
	})
	t.Run("a filter that keeps few is partial", func(t *testing.T) {
		t.Parallel()
		page, err := f.reader.QueryConversations(f.ctx, inspect.ConversationQuery{Order: inspect.OrderID, Awaiting: true, Limit: 50, Scan: 10})
		require.NoError(t, err)
		require.Equal(t, 10, page.Scanned)
		require.True(t, page.Partial)
		require.Equal(t, "i"+f.ids[9], page.Next)
	})
	t.Run("bad queries", func(t *testing.T) {
		t.Parallel()
		for _, q := range []inspect.ConversationQuery{{Limit: 5001}, {Scan: 100_001}, {Order: "x"}, {Order: inspect.OrderID, Cursor: "r5"},
			{Cursor: "iabc"}, {Statuses: []arbortype.Status{arbortype.StatusFailed}}} {
			_, err := f.reader.QueryConversations(f.ctx, q)
			require.ErrorIs(t, err, arbortype.ErrInvalidArgument, "%+v", q)
		}
	})
	t.Run("awaits", func(t *testing.T) {
		t.Parallel()
		var got []string
		for q := (inspect.AwaitQuery{Limit: 4}); ; {
			page, err := f.reader.Awaits(f.ctx, q)
			require.NoError(t, err)
			for _, a := range page.Awaits {
				require.Equal(t, "approval", a.AwaitName)
				require.NotEmpty(t, a.AwaitToken)
				got = append(got, a.ConversationID)
			}
			if page.Next == "" {
				break
			}
			q.Cursor = page.Next
		}
		require.Equal(t, keep(func(_ int, id string) bool { return f.await[id] }), got)
		one, err := f.reader.Awaits(f.ctx, inspect.AwaitQuery{ConversationID: f.ids[5]})
		require.NoError(t, err)
		require.Len(t, one.Awaits, 1)
		require.Equal(t, f.ids[5], one.Awaits[0].ConversationID)
		none, err := f.reader.Awaits(f.ctx, inspect.AwaitQuery{ConversationID: f.ids[1]})
		require.NoError(t, err)
		require.Empty(t, none.Awaits)
	})
	t.Run("counts", func(t *testing.T) {
		t.Parallel()
		n, err := f.reader.LiveTaskCounts(f.ctx, 1000)
		require.NoError(t, err)
		require.Equal(t, len(f.await), n.Awaiting)
		require.Equal(t, len(f.await), n.ByStatus[arbortype.StatusSleeping])
		require.Equal(t, len(f.running), n.ByStatus[arbortype.StatusRunning])
		require.False(t, n.Capped)
		n, err = f.reader.LiveTaskCounts(f.ctx, 5)
		require.NoError(t, err)
		require.True(t, n.Capped)
	})
	t.Run("holders", func(t *testing.T) {
		t.Parallel()
		// The test's leases are a holder row each, all named "test".
		hs, err := f.reader.Holders(f.ctx, 1000, 1000)
		require.NoError(t, err)
		held := 0
		for _, h := range hs {
			require.Equal(t, "test", h.Name)
			require.True(t, h.ExpiresAt.After(h.Now))
			held += h.Held
		}
		require.Equal(t, len(f.failed)+len(f.await)+len(f.running), held)
		require.True(t, slices.IsSortedFunc(hs, func(a, b inspect.Holder) int { return int(b.ID - a.ID) }), "newest first")
	})
}

// TestTreeAndLogPages: a conversation's tasks, a task's children and a
// task's log entries page without loss, and what a page leaves out is
// counted.
func TestTreeAndLogPages(t *testing.T) {
	t.Parallel()
	f := newInspectFixture(t, 0)
	conv := testdb.Conversation(t)
	root, _, err := f.engine.Create(f.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	var ps []arbortype.CreateParams
	for range 95 {
		ps = append(ps, arbortype.CreateParams{ConversationID: conv, OwnerID: root.ID, Kind: "tool"})
	}
	kids, _, err := f.engine.CreateMany(f.ctx, ps)
	require.NoError(t, err)
	run, err := f.engine.Start(f.ctx, root.ID)
	require.NoError(t, err)
	ids := make([]int64, len(kids))
	for i, k := range kids {
		ids[i] = k.ID
	}
	_, err = f.engine.WaitForChildren(f.ctx, root.ID, run.Token, core.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled})
	require.NoError(t, err)

	var tree []int64
	for q := (inspect.TreeQuery{ConversationID: conv, Limit: 10}); ; {
		page, err := f.reader.Tree(f.ctx, q)
		require.NoError(t, err)
		require.Equal(t, map[arbortype.Status]int{arbortype.StatusWaiting: 1, arbortype.StatusPending: 95}, page.Counts)
		for _, task := range page.Tasks {
			tree = append(tree, task.ID)
			if task.ID == root.ID {
				require.Equal(t, 95, page.Children[root.ID])
				require.Equal(t, 95, task.WaitCount)
				require.Len(t, task.WaitIDs, 20, "the wait's ids are cut")
				require.Nil(t, task.Input)
			}
		}
		if page.Next == 0 {
			break
		}
		q.After = page.Next
	}
	require.Equal(t, append([]int64{root.ID}, ids...), tree)
	page, err := f.reader.Tree(f.ctx, inspect.TreeQuery{ConversationID: conv, Statuses: []arbortype.Status{arbortype.StatusWaiting}})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1)
	_, err = f.reader.Tree(f.ctx, inspect.TreeQuery{ConversationID: "nobody-" + conv})
	require.ErrorIs(t, err, arbortype.ErrNotFound)

	var children []int64
	for after := int64(0); ; {
		page, err := f.reader.ChildrenAfter(f.ctx, root.ID, after, 30)
		require.NoError(t, err)
		require.Equal(t, 95, page.Total)
		for _, c := range page.Tasks {
			children = append(children, c.ID)
		}
		if page.Next == 0 {
			break
		}
		after = page.Next
	}
	require.Equal(t, ids, children)

	// The root's entries (created, running, waiting) among 97 of the
	// conversation's, found 2 a page with a scan of 20.
	var seen []arbortype.Status
	pages := 0
	for q := (inspect.LogQuery{ConversationID: conv, TaskID: root.ID, Limit: 2, Scan: 20}); ; pages++ {
		page, err := f.reader.ReadLogPage(f.ctx, q)
		require.NoError(t, err)
		for _, en := range page.Entries {
			require.Equal(t, root.ID, en.TaskID)
			seen = append(seen, en.Status)
		}
		if page.Older == 0 {
			break
		}
		q.Before = page.Older
	}
	require.Equal(t, []arbortype.Status{arbortype.StatusWaiting, arbortype.StatusRunning, arbortype.StatusPending}, seen)
	require.Greater(t, pages, 3, "the scan was bounded")

	_, _, err = f.engine.Emit(f.ctx, tasks.EmitParams{ConversationID: conv, Name: "big", Payload: json.RawMessage(`"` + strings.Repeat("x", 10_000) + `"`)})
	require.NoError(t, err)
	head, err := f.reader.ReadLogPage(f.ctx, inspect.LogQuery{ConversationID: conv, Limit: 1, MaxPayload: 5})
	require.NoError(t, err)
	require.Len(t, head.Entries, 1)
	require.Equal(t, arbortype.LogKindEvent, head.Entries[0].Kind)
	require.True(t, head.Entries[0].Cut())
	require.Len(t, head.Entries[0].Payload, 5)
	require.Greater(t, head.Entries[0].PayloadBytes, 10_000)
	tail, err := f.reader.ReadLogPage(f.ctx, inspect.LogQuery{ConversationID: conv, After: head.Entries[0].Seq - 2})
	require.NoError(t, err)
	require.Len(t, tail.Entries, 2)
	require.True(t, tail.Entries[1].Cut())
	require.Len(t, tail.Entries[1].Payload, inspect.MaxPayloadDefault)
	last, err := f.reader.LastLogSeq(f.ctx)
	require.NoError(t, err)
	require.Equal(t, head.Entries[0].Seq, last)
}
