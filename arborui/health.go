package arborui

import (
	"context"
	"fmt"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/inspect"
)

// What tells a turn queued behind a live one from work that is stuck,
// from what the tables hold (no guess): a pending turn (root task) behind
// an older live turn of its conversation is queued — the generation rule
// runs a conversation's turns oldest first — and shown as such. Stuck is
// one of:
//   - a running task past its task lease: its run wrote no checkpoint or
//     heartbeat in time (a hung handler; the runner's watchdog should have
//     stopped it);
//   - live work in a conversation whose holder's lease expired: it awaits
//     a take-over;
//   - a pending task that is not a queued turn, created more than
//     stuckAfter ago, in a conversation that no live holder holds: no
//     runner takes it (none runs its kind, or none runs at all).
//
// A pending task in a held conversation is waiting for a worker (or a
// concurrency limit's slot), which the limits page shows: not stuck.

// stuckAfter is how long a pending task may wait, with no holder, before
// the view calls it stuck.
const stuckAfter = time.Minute

// stuckAfterWords is stuckAfter as a sentence says it.
const stuckAfterWords = "a minute"

// stateBound bounds each count of a conversation's state.
const stateBound = 10_000

// health is a conversation's state as the list shows it.
type health struct {
	Queued int
	Stuck  []string
}

// conversationHealth is what a listing row says of conversation c, whose
// state is s.
func conversationHealth(c arbortype.ConversationSummary, s inspect.ConversationState) health {
	out := health{Queued: s.Queued}
	live := 0
	for st, n := range c.Live {
		if st.Live() {
			live += n
		}
	}
	lapsed := c.Holder != "" && c.LeaseExpiresAt != nil && c.LeaseExpiresAt.Before(s.Now)
	if s.Overdue > 0 {
		out.Stuck = append(out.Stuck, fmt.Sprintf("%d running past %s task lease", s.Overdue, map[bool]string{true: "its", false: "their"}[s.Overdue == 1]))
	}
	if lapsed && live > 0 {
		out.Stuck = append(out.Stuck, "its holder's lease expired "+round(s.Now.Sub(*c.LeaseExpiresAt))+" ago: awaiting a take-over")
	}
	if s.StalePending && (c.Holder == "" || lapsed) {
		out.Stuck = append(out.Stuck, "pending over "+stuckAfterWords+" with no holder")
	}
	return out
}

// taskState says what a tree draws of task t, in conversation c whose
// state is s: "queued", a reason it is stuck, or "".
func taskState(t arbortype.Task, c arbortype.Conversation, s inspect.ConversationState) (queued bool, stuck string) {
	lapsed := c.Holder != "" && c.LeaseExpiresAt != nil && c.LeaseExpiresAt.Before(s.Now)
	switch t.Status {
	case arbortype.StatusPending:
		if t.OwnerID == 0 && s.FirstLiveRoot != 0 && t.ID > s.FirstLiveRoot {
			return true, ""
		}
		if (c.Holder == "" || lapsed) && s.Now.Sub(t.CreatedAt) > stuckAfter {
			return false, "stuck: pending " + round(s.Now.Sub(t.CreatedAt)) + " with no holder"
		}
	case arbortype.StatusRunning:
		if t.LeaseExpiresAt != nil && t.LeaseExpiresAt.Before(s.Now) {
			return false, "stuck: past its task lease by " + round(s.Now.Sub(*t.LeaseExpiresAt))
		}
	}
	if lapsed && (t.Status == arbortype.StatusPending || t.Status == arbortype.StatusRunning) {
		return false, "stuck: its holder's lease expired"
	}
	return false, ""
}

// conversationStates reads the states of the conversations listed.
func (h *handler) conversationStates(ctx context.Context, ids []string) (map[string]inspect.ConversationState, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return h.reader.ConversationStates(ctx, ids, stuckAfter, stateBound)
}
