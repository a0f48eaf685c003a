package core_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/testdb"
)

// documented are the errors an operation may return on a racing tree.
var documented = []error{
	arbortype.ErrInvalidTransition, arbortype.ErrOwnerNotLive, arbortype.ErrAlreadyRunning, arbortype.ErrNotRunning,
	arbortype.ErrLeaseLost, arbortype.ErrAborted, arbortype.ErrNotChild,
}

// TestStressRandomOperations: fifty goroutines doing random operations
// (create child, start, checkpoint, complete, fail, wait, cancel, abort) over
// two conversations of a few hundred tasks. Afterwards the invariant checker
// finds nothing, every error was a documented one, and no deadlock or
// serialization failure reached a caller.
func TestStressRandomOperations(t *testing.T) {
	t.Parallel()
	const (
		workers = 50
		opsEach = 80
	)
	b := setup(t)
	convs := []string{b.conv, testdb.Conversation(t)}
	t.Cleanup(func() {
		vs, err := b.engine.Check(b.ctx, convs[1])
		require.NoError(t, err)
		require.Empty(t, vs)
	})

	var (
		mu     sync.Mutex
		ids    = map[string][]int64{}
		tokens = map[int64]int64{}
		counts sync.Map // op name -> *atomic.Int64
	)
	// A few hundred tasks to start from: 20 running roots per conversation,
	// each with 6 children.
	for _, conv := range convs {
		for range 20 {
			root, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
			require.NoError(t, err)
			run := b.start(t, root.ID)
			ids[conv] = append(ids[conv], root.ID)
			tokens[root.ID] = run.Token
			for range 6 {
				c, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: root.ID, Kind: "tool"})
				require.NoError(t, err)
				ids[conv] = append(ids[conv], c.ID)
			}
		}
	}
	// pick favours recent tasks, which are more likely live.
	pick := func(r *rand.Rand, conv string) (int64, int64) {
		mu.Lock()
		defer mu.Unlock()
		list := ids[conv]
		i := r.IntN(len(list))
		if r.IntN(10) < 7 && len(list) > 100 {
			i = len(list) - 1 - r.IntN(100)
		}
		id := list[i]
		return id, tokens[id]
	}
	count := func(op string) {
		c, _ := counts.LoadOrStore(op, new(atomic.Int64))
		c.(*atomic.Int64).Add(1)
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 42))
			for range opsEach {
				conv := convs[r.IntN(len(convs))]
				id, token := pick(r, conv)
				var (
					op  string
					err error
				)
				switch n := r.IntN(100); {
				case n < 3:
					op = "root"
					var c arbortype.Task
					c, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn"})
					if err == nil {
						mu.Lock()
						ids[conv] = append(ids[conv], c.ID)
						mu.Unlock()
					}
				case n < 33:
					op = "create"
					var c arbortype.Task
					c, _, err = b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: conv, OwnerID: id, Kind: "k", Background: r.IntN(10) == 0})
					if err == nil {
						mu.Lock()
						ids[conv] = append(ids[conv], c.ID)
						mu.Unlock()
					}
				case n < 53:
					op = "start"
					var s arbortype.Task
					s, err = b.engine.Start(b.ctx, id)
					if err == nil {
						mu.Lock()
						tokens[id] = s.Token
						mu.Unlock()
					}
				case n < 58:
					op = "checkpoint"
					_, err = b.engine.Checkpoint(b.ctx, id, token, "p", js(`{"w": 1}`))
				case n < 73:
					op = "complete"
					_, err = b.engine.Complete(b.ctx, id, token, js(`"r"`))
				case n < 80:
					op = "fail"
					_, err = b.engine.Fail(b.ctx, id, token, arbortype.TaskError{Message: "stress"})
				case n < 94:
					op = "wait"
					var kids []arbortype.Task
					kids, err = b.engine.Children(b.ctx, id)
					if err == nil {
						var wait []int64
						for _, k := range kids {
							if r.IntN(2) == 0 {
								wait = append(wait, k.ID)
							}
						}
						policy := arbortype.AllSettled
						if r.IntN(2) == 0 {
							policy = arbortype.FailFast
						}
						_, err = b.engine.WaitForChildren(b.ctx, id, token, core.WaitParams{ChildIDs: wait, Policy: policy})
					}
				case n < 98:
					op = "cancel"
					_, err = b.engine.Cancel(b.ctx, id, nil)
				default:
					op = "abort"
					_, err = b.engine.Abort(b.ctx, id)
				}
				count(op)
				if err == nil {
					count(op + ":ok")
					continue
				}
				known := false
				for _, d := range documented {
					known = known || errors.Is(err, d)
				}
				if !known {
					t.Errorf("%s on task %d: undocumented error: %v", op, id, err)
				}
			}
		}()
	}
	wg.Wait()

	total := 0
	counts.Range(func(k, v any) bool {
		t.Logf("%s: %d", k, v.(*atomic.Int64).Load())
		if op := k.(string); len(op) < 3 || op[len(op)-3:] != ":ok" {
			total += int(v.(*atomic.Int64).Load())
		}
		return true
	})
	require.Equal(t, workers*opsEach, total)
	for _, op := range []string{"root", "create", "start", "checkpoint", "complete", "fail", "wait", "cancel", "abort"} {
		c, ok := counts.Load(op + ":ok")
		require.True(t, ok && c.(*atomic.Int64).Load() > 0, "%s succeeded at least once", op)
	}
	// Settle what is left so the conversations end with no live task.
	for _, conv := range convs {
		var live int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.schema+`.tasks WHERE conversation_id = $1 AND status = $2`,
			conv, string(arbortype.StatusPending)).Scan(&live))
		t.Logf("%s: %d tasks, %d pending", conv, len(ids[conv]), live)
	}
}
