package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/store"
)

// The operator's reads of the web view (issue 41): what tells a queued
// turn from stuck work, an await's context, and the turns over time.

// ConversationState is what tells, in one conversation, a turn queued
// behind a live one from work that is stuck.
type ConversationState struct {
	// Now is the database's clock at the read: compare the rows' times
	// with it, not with the web server's.
	Now time.Time
	// FirstLiveRoot is the conversation's oldest live turn (root task),
	// the one that runs; 0 when none is live. A pending root with a larger
	// id is queued behind it.
	FirstLiveRoot int64
	// Queued counts the pending turns behind FirstLiveRoot, Overdue the
	// running tasks past their task lease (no checkpoint or heartbeat in
	// time: a handler that hangs), each up to the read's bound.
	Queued, Overdue int
	// StalePending says a pending task that is not a queued turn was
	// created longer ago than the read's threshold.
	StalePending bool
}

// ConversationStates reads the states of conversations ids (at most
// 1000), each count bounded by limit (1..100,000); stale is the age past
// which a pending task is StalePending. A conversation that does not
// exist is left out.
func (e *Reader) ConversationStates(ctx context.Context, ids []string, stale time.Duration, limit int) (map[string]ConversationState, error) {
	if err := errors.Join(bound("conversation states", "conversations", max(len(ids), 1), 1000),
		bound("conversation states", "limit", limit, 100_000)); err != nil {
		return nil, err
	}
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.ConversationState, error) {
		return e.core.Store.ConversationStates(ctx, db, ids, stale, limit)
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]ConversationState, len(rows))
	for _, r := range rows {
		out[r.ID] = ConversationState{Now: r.Now, FirstLiveRoot: r.FirstLiveRoot, Queued: r.Queued, Overdue: r.Overdue, StalePending: r.StalePending}
	}
	return out, nil
}

// LiveRootIDs reads up to limit (1..1000) live turns (root tasks) of
// conversation conv, the oldest first.
func (e *Reader) LiveRootIDs(ctx context.Context, conv string, limit int) ([]int64, error) {
	if err := bound("live turns", "limit", limit, 1000); err != nil {
		return nil, err
	}
	return core.Read(ctx, e.core, func(db store.DB) ([]int64, error) { return e.core.Store.LiveRootIDs(ctx, db, conv, limit) })
}

// NewestRootID reads the id of conversation conv's newest turn (root
// task): arbortype.ErrNotFound when it has none.
func (e *Reader) NewestRootID(ctx context.Context, conv string) (int64, error) {
	id, err := core.Read(ctx, e.core, func(db store.DB) (int64, error) { return e.core.Store.NewestRootID(ctx, db, conv) })
	if store.IsNoRows(err) {
		return 0, fmt.Errorf("conversation %q has no turn: %w", conv, arbortype.ErrNotFound)
	}
	return id, err
}

// AwaitContext is what a handler saved with its await: its checkpoint
// state (AwaitEvent's State), as text cut to the read's bound, and the
// whole text's length in characters. (An await carries no payload of its
// own: its name, phase and state are what is stored.)
type AwaitContext struct {
	State  string
	Length int
}

// AwaitContexts reads the saved states of tasks ids (at most 1000), each
// cut to most characters, by task id; a task without a state is absent.
func (e *Reader) AwaitContexts(ctx context.Context, ids []int64, most int) (map[int64]AwaitContext, error) {
	if err := errors.Join(bound("await contexts", "tasks", max(len(ids), 1), 1000), bound("await contexts", "most", most, 1<<20)); err != nil {
		return nil, err
	}
	rows, err := core.Read(ctx, e.core, func(db store.DB) ([]store.AwaitContext, error) {
		return e.core.Store.AwaitContexts(ctx, db, ids, most)
	})
	if err != nil {
		return nil, err
	}
	out := make(map[int64]AwaitContext, len(rows))
	for _, r := range rows {
		if r.Length > 0 {
			out[r.TaskID] = AwaitContext{State: r.State, Length: r.Length}
		}
	}
	return out, nil
}

// TurnMinute is one tenant's turns in one minute: started, settled and,
// of those settled, failed.
type TurnMinute struct {
	Tenant                   string
	Minute                   time.Time
	Started, Settled, Failed int
}

// TenantPending is one tenant's pending tasks: how many (Capped: at least
// that many), and the head of its queue's creation time.
type TenantPending struct {
	Tenant string
	N      int
	Capped bool
	Oldest time.Time
}

// TurnStats are the turns over a window, per tenant and minute, and the
// pending work per tenant now.
type TurnStats struct {
	// Now is the database's clock at the read.
	Now time.Time
	// Minutes are the turns per tenant and minute, by minute then tenant;
	// a minute without a turn is absent.
	Minutes []TurnMinute
	// StartedCapped: the starts were counted among the newest Scan tasks
	// only (a turn created before them that started in the window is not
	// counted); SettledCapped: the settles read reached Scan.
	StartedCapped, SettledCapped bool
	Scan                         int
	// Depth is the bound of each tenant's pending count.
	Depth int
	// Pending is each tenant's pending work; TenantsCapped: more tenants
	// have some than were read.
	Pending       []TenantPending
	TenantsCapped bool
}

// TurnStats reads the turns started, settled and failed per tenant and
// minute over the last window (1 min..24 h), reading at most scan
// (1..1,000,000) tasks of each, and the pending depth (counted up to
// depth, 1..1,000,000) and oldest pending of up to tenants (1..1000)
// tenants.
func (e *Reader) TurnStats(ctx context.Context, window time.Duration, scan, depth, tenants int) (TurnStats, error) {
	if window < time.Minute || window > 24*time.Hour {
		return TurnStats{}, fmt.Errorf("turn stats: window %s is outside 1m..24h: %w", window, arbortype.ErrInvalidArgument)
	}
	if err := errors.Join(bound("turn stats", "scan", scan, 1_000_000), bound("turn stats", "depth", depth, 1_000_000),
		bound("turn stats", "tenants", tenants, 1000)); err != nil {
		return TurnStats{}, err
	}
	return core.Read(ctx, e.core, func(db store.DB) (TurnStats, error) {
		out := TurnStats{Scan: scan, Depth: depth}
		settled, err := e.core.Store.SettledTurnsPerMinute(ctx, db, window, scan)
		if err != nil {
			return out, err
		}
		started, scanned, now, err := e.core.Store.StartedTurnsPerMinute(ctx, db, window, scan)
		if err != nil {
			return out, err
		}
		pending, err := e.core.Store.PendingByTenant(ctx, db, tenants+1, depth)
		if err != nil {
			return out, err
		}
		out.Now, out.StartedCapped = now, scanned >= scan
		type key struct {
			tenant string
			minute int64
		}
		at := map[key]int{}
		add := func(m store.TurnMinute) *TurnMinute {
			k := key{m.Tenant, m.Minute.Unix()}
			i, ok := at[k]
			if !ok {
				i = len(out.Minutes)
				at[k] = i
				out.Minutes = append(out.Minutes, TurnMinute{Tenant: m.Tenant, Minute: m.Minute})
			}
			return &out.Minutes[i]
		}
		n := 0
		for _, m := range settled {
			t := add(m)
			t.Settled, t.Failed = m.Settled, m.Failed
			n += m.Settled
		}
		out.SettledCapped = n >= scan
		for _, m := range started {
			add(m).Started = m.Started
		}
		slices.SortFunc(out.Minutes, func(a, b TurnMinute) int {
			if c := a.Minute.Compare(b.Minute); c != 0 {
				return c
			}
			return strings.Compare(a.Tenant, b.Tenant)
		})
		if len(pending) > tenants {
			pending, out.TenantsCapped = pending[:tenants], true
		}
		for _, p := range pending {
			out.Pending = append(out.Pending, TenantPending{Tenant: p.Tenant, N: p.N, Capped: p.N >= depth, Oldest: p.Oldest})
		}
		return out, nil
	})
}

// bound refuses n outside 1..most, naming op and the bound.
func bound(op, name string, n, most int) error {
	if n < 1 || n > most {
		return fmt.Errorf("%s: %s %d is outside 1..%d: %w", op, name, n, most, arbortype.ErrInvalidArgument)
	}
	return nil
}
