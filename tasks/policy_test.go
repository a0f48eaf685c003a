package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// Fifty messages arrive at once on one conversation, each starting a turn:
// the policy says exactly what comes of them (open-design #5490, langgraph
// #8796: concurrent starts forked a conversation's state).
//   - queue: fifty turns, one live root at a time once they run (the
//     generation rule), all created;
//   - reject: one turn; the forty-nine others are arbortype.ErrBusy naming it, and
//     write nothing;
//   - interrupt: fifty turns, each aborting the one before with a reason:
//     one live, forty-nine aborted;
//   - steer: one turn, and forty-nine queued events to it, one per message,
//     in the log, each message also a turn of its own queued behind it (it
//     answers the message if the live turn does not take it).
func TestTurnPoliciesUnderConcurrentStarts(t *testing.T) {
	t.Parallel()
	for _, policy := range []arbortype.TurnPolicy{arbortype.TurnQueue, arbortype.TurnReject, arbortype.TurnInterrupt, arbortype.TurnSteer} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			eng, _ := engineWith(t, func(c *pgxpool.Config) { c.MaxConns = 20 })
			conv := testdb.Conversation(t)
			const n = 50
			type outcome struct {
				task    arbortype.Task
				created bool
				err     error
			}
			out := make(chan outcome, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					task, created, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", OnBusy: policy,
						Input: json.RawMessage(fmt.Sprintf(`{"message": %d}`, i))})
					out <- outcome{task, created, err}
				})
			}
			wg.Wait()
			close(out)
			var created, busy, steered int
			ids := map[int64]bool{}
			for o := range out {
				switch {
				case o.err != nil:
					require.ErrorIs(t, o.err, arbortype.ErrBusy, "only reject refuses")
					require.Equal(t, arbortype.TurnReject, policy)
					busy++
				case o.created:
					created++
				default:
					steered++
				}
				if o.err == nil {
					ids[o.task.ID] = true
				}
			}
			all, err := eng.ConversationTasks(ctx, conv)
			require.NoError(t, err)
			live, aborted := 0, 0
			for _, task := range all {
				switch {
				case task.Status.Live():
					live++
				case task.Status == arbortype.StatusAborted || task.Status == arbortype.StatusOrphaned:
					aborted++
					require.Equal(t, arbortype.CodeAborted, task.Error.Code)
					require.Equal(t, "interrupted by a new turn", task.Error.Message)
				}
			}
			switch policy {
			case arbortype.TurnQueue:
				require.Equal(t, n, created)
				require.Len(t, all, n)
				require.Equal(t, n, live)
			case arbortype.TurnReject:
				require.Equal(t, 1, created)
				require.Equal(t, n-1, busy)
				require.Len(t, all, 1)
			case arbortype.TurnInterrupt:
				require.Equal(t, n, created)
				require.Len(t, all, n)
				require.Equal(t, 1, live, "the last turn is the live one")
				require.Equal(t, n-1, aborted)
			case arbortype.TurnSteer:
				require.Equal(t, 1, created)
				require.Equal(t, n-1, steered)
				require.Len(t, all, n, "the live turn, and each steered message's own turn queued behind it")
				require.Equal(t, n, live)
				require.Len(t, ids, 1, "every steered message names the live turn")
				log, err := eng.ReadLog(ctx, conv, 0, 1000)
				require.NoError(t, err)
				events := 0
				for _, en := range log {
					if en.Kind == arbortype.LogKindEvent && en.Name == tasks.SteerEventDefault && en.TaskID == all[0].ID {
						events++
					}
				}
				require.Equal(t, n-1, events, "each steered message is an event of its own")
			}
			vs, err := eng.Check(ctx, conv)
			require.NoError(t, err)
			require.Empty(t, vs)
		})
	}
}

// A policy configured per kind applies to creates that say none
// (arbortype.TurnDefault), and an explicit OnBusy (arbortype.TurnQueue too) overrides it; a
// repeated create (same key) of the live turn returns it instead of being
// refused.
func TestTurnPolicyPerKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := testdb.Fresh(t)
	pool := testdb.NewPool(t)
	eng, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TurnPolicies: map[string]arbortype.TurnPolicy{"turn": arbortype.TurnReject}})
	require.NoError(t, err)
	conv := testdb.Conversation(t)
	first, created, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", IdempotencyKey: "msg-1"})
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", IdempotencyKey: "msg-1"})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, first.ID, again.ID)
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", IdempotencyKey: "msg-2"})
	require.ErrorIs(t, err, arbortype.ErrBusy)
	require.Contains(t, err.Error(), fmt.Sprint(first.ID))
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", OnBusy: arbortype.TurnDefault, IdempotencyKey: "msg-3"})
	require.ErrorIs(t, err, arbortype.ErrBusy, "arbortype.TurnDefault is the kind's configured policy")
	queued, created, err := eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", OnBusy: arbortype.TurnQueue, IdempotencyKey: "msg-4"})
	require.NoError(t, err, "an explicit arbortype.TurnQueue queues over the kind's policy")
	require.True(t, created)
	require.Equal(t, arbortype.StatusPending, queued.Status)
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "note"})
	require.NoError(t, err, "another kind queues")
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: first.ID, Kind: "tool", OnBusy: arbortype.TurnQueue})
	require.NoError(t, err, "arbortype.TurnQueue means nothing for a child, and is accepted")
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", OnBusy: "shout"})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, err = tasks.New(ctx, pool, &tasks.Config{Schema: schema, TurnPolicies: map[string]arbortype.TurnPolicy{"turn": "shout"}})
	require.ErrorIs(t, err, arbortype.ErrInvalidArgument)
	_, _, err = eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: first.ID, Kind: "tool", OnBusy: arbortype.TurnReject})
	require.True(t, errors.Is(err, arbortype.ErrInvalidArgument), "a policy is for turns: %v", err)
}
