package machine

import (
	"slices"

	"github.com/arborhq/arbor/arbortype"
)

// generations applies the rule that at most one live generation (turn) of a
// conversation runs at a time, oldest first. roots are the conversation's
// live root tasks in id order; isGeneration says which kinds are
// generations (nil: every root is one). It returns the roots that may start
// now: every pending root that is not a generation, and of the generations
// either the one already under way (started before: woken from a wait or a
// sleep, or requeued by recovery) when it is pending, or, when none is
// under way, the oldest that never ran. A generation that is waiting or
// sleeping is under way too: the next one waits for it to settle.
func generations(roots []arbortype.Task, isGeneration func(kind string) bool) (startable []int64) {
	var active, next *arbortype.Task
	for i := range roots {
		r := &roots[i]
		if isGeneration != nil && !isGeneration(r.Kind) {
			if r.Status == arbortype.StatusPending {
				startable = append(startable, r.ID)
			}
			continue
		}
		if r.StartedAt != nil && active == nil {
			active = r
		}
		if r.Status == arbortype.StatusPending && r.StartedAt == nil && next == nil {
			next = r
		}
	}
	switch {
	case active != nil && active.Status == arbortype.StatusPending:
		startable = append(startable, active.ID)
	case active == nil && next != nil:
		startable = append(startable, next.ID)
	}
	slices.Sort(startable)
	if startable == nil {
		startable = []int64{} // none: not "any root"
	}
	return startable
}
