package tasks_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

type ctxKey struct{}

// injector returns the context's value as the trace context, and counts
// its calls.
type injector struct{ calls atomic.Int64 }

func (i *injector) InjectTrace(ctx context.Context) map[string]string {
	i.calls.Add(1)
	v, _ := ctx.Value(ctxKey{}).(map[string]string)
	return v
}

func traceEngine(t *testing.T) (*tasks.Engine, *injector) {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	inj := &injector{}
	eng, err := tasks.New(context.Background(), pool, &tasks.Config{Schema: schema, TraceInjector: inj,
		TurnPolicies: map[string]arbortype.TurnPolicy{"interrupting": arbortype.TurnInterrupt}})
	require.NoError(t, err)
	return eng, inj
}

// Every create path stores the injector's trace context for the creating
// context with the task, as read back; the injector is called once per
// call, whatever the number of tasks.
func TestCreateStoresTheTraceContext(t *testing.T) {
	t.Parallel()
	eng, inj := traceEngine(t)
	conv := testdb.Conversation(t)
	withTrace := func(id string) context.Context {
		return context.WithValue(context.Background(), ctxKey{}, map[string]string{"traceparent": id})
	}
	check := func(id int64, want string) {
		t.Helper()
		got, err := eng.Get(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, map[string]string{"traceparent": want}, got.Trace)
	}

	root, _, err := eng.Create(withTrace("root"), arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	require.Equal(t, "root", root.Trace["traceparent"])
	check(root.ID, "root")

	child, _, err := eng.Create(withTrace("child"), arbortype.CreateParams{ConversationID: conv, OwnerID: root.ID, Kind: "tool"})
	require.NoError(t, err)
	check(child.ID, "child")

	before := inj.calls.Load()
	many, _, err := eng.CreateMany(withTrace("many"), []arbortype.CreateParams{
		{ConversationID: conv, OwnerID: root.ID, Kind: "tool"}, {ConversationID: conv, OwnerID: root.ID, Kind: "tool"}})
	require.NoError(t, err)
	require.Equal(t, before+1, inj.calls.Load(), "one injection for the whole CreateMany")
	for _, task := range many {
		require.Equal(t, "many", task.Trace["traceparent"])
		check(task.ID, "many")
	}

	// A turn policy's path (an interrupting turn aborts the live one).
	other := testdb.Conversation(t)
	first, _, err := eng.Create(withTrace("first"), arbortype.CreateParams{ConversationID: other, Kind: "interrupting"})
	require.NoError(t, err)
	second, _, err := eng.Create(withTrace("second"), arbortype.CreateParams{ConversationID: other, Kind: "interrupting"})
	require.NoError(t, err)
	check(first.ID, "first")
	check(second.ID, "second")

	// No trace in the context: nothing stored.
	plain, _, err := eng.Create(context.Background(), arbortype.CreateParams{ConversationID: conv, OwnerID: root.ID, Kind: "tool"})
	require.NoError(t, err)
	got, err := eng.Get(context.Background(), plain.ID)
	require.NoError(t, err)
	require.Nil(t, got.Trace)
}

// A trace context over the bound, or with an empty key, is refused with
// arbortype.ErrInvalidArgument and nothing is written.
func TestCreateRefusesABadTraceContext(t *testing.T) {
	t.Parallel()
	eng, _ := traceEngine(t)
	for name, trace := range map[string]map[string]string{
		"too large": {"traceparent": strings.Repeat("x", 5000)},
		"empty key": {"": "x"},
	} {
		conv := testdb.Conversation(t)
		ctx := context.WithValue(context.Background(), ctxKey{}, trace)
		_, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, name)
		_, _, err = eng.CreateMany(ctx, []arbortype.CreateParams{{ConversationID: conv, Kind: "turn"}})
		require.ErrorIs(t, err, arbortype.ErrInvalidArgument, name)
		_, err = eng.ConversationTasks(context.Background(), conv)
		require.ErrorIs(t, err, arbortype.ErrNotFound, "%s: not even the conversation was written", name)
	}
}

// A fork's copies keep the trace context their sources were created in
// (issue 24: Fork dropped it).
func TestForkKeepsTheTraceContext(t *testing.T) {
	t.Parallel()
	eng, _ := traceEngine(t)
	conv := testdb.Conversation(t)
	ctx := context.WithValue(context.Background(), ctxKey{}, map[string]string{"traceparent": "turn-1"})
	turn, _, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
	require.NoError(t, err)
	_, err = eng.Cancel(context.Background(), turn.ID, nil)
	require.NoError(t, err)
	f, err := eng.Fork(context.Background(), tasks.ForkParams{ConversationID: conv, ThroughTurn: turn.ID})
	require.NoError(t, err)
	copies, err := eng.ConversationTasks(context.Background(), f.ConversationID)
	require.NoError(t, err)
	require.Len(t, copies, 1)
	require.Equal(t, map[string]string{"traceparent": "turn-1"}, copies[0].Trace)
}
