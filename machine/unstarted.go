package machine

import (
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// unstartedRun is a run this node claimed whose handler it has not entered
// (Runner.unstarted): its conversation, and when it was claimed.
type unstartedRun struct {
	conv string
	at   time.Time
}

// unstartedKept is the least time an entry of a conversation this node
// neither holds nor has lapsed is kept: long enough for a new life's
// take-back, through the open path, of what its earlier life held.
const unstartedKept = time.Minute

// claimedRuns records the runs a transaction of this node claims, inside
// it, before it commits (core.ClaimParamsFor.Claimed): unstarted until
// their handlers are entered (start). See docs/architecture.md, "Restarts:
// what counts".
func (r *Runner) claimedRuns(runs []arbortype.Task) {
	now := time.Now()
	r.mu.Lock()
	for _, t := range runs {
		r.unstarted[t.Token] = unstartedRun{conv: t.ConversationID, at: now}
	}
	hook := r.testClaimed
	r.mu.Unlock()
	if hook != nil {
		hook(runs)
	}
}

// uncalled answers a recovery of this node (recovery.Uncalled): the run of
// token was claimed here and its handler never entered.
func (r *Runner) uncalled(token int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.unstarted[token]
	return ok
}

// forgetUnstarted drops the entries of conversations this node neither
// holds nor has lapsed, past unstartedKept or ten leases (under r.mu):
// their conversations were recovered, released or taken over. A token is
// never reused, so an entry left over would change nothing; this bounds
// the memory.
func (r *Runner) forgetUnstarted(now time.Time) {
	kept := max(unstartedKept, 10*r.cfg.ConversationLease)
	for token, u := range r.unstarted {
		if now.Sub(u.at) < kept {
			continue
		}
		if _, held := r.held[u.conv]; held {
			continue
		}
		if _, lapsed := r.lapsed[u.conv]; lapsed {
			continue
		}
		delete(r.unstarted, token)
	}
}
