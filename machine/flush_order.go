package machine

import "github.com/arborhq/arbor/internal/core"

// A flush's hold on its conversations, as this node sees it: which of its
// flushes are in flight in each conversation, the outcomes parked behind
// them and the claims they skipped (Runner.flushingIn, outcomesAfter,
// afterFlush, under Runner.mu). The completer (completer.go) counts each
// flush in and out; the claim paths consult it.

// flushBegin counts a flush in flight in each of its conversations, before
// it can lock them; flushEnd, after its commit (or its end), claims in the
// conversations a claim skipped while a flush held them, and queues again
// the outcomes a flush skipped while this one held their conversation.
func (r *Runner) flushBegin(convs []string) {
	r.mu.Lock()
	for _, c := range convs {
		r.flushingIn[c]++
	}
	r.mu.Unlock()
}

func (r *Runner) flushEnd(convs []string) {
	var again []string
	var outs []*queued
	r.mu.Lock()
	for _, c := range convs {
		if r.flushingIn[c]--; r.flushingIn[c] > 0 {
			continue
		}
		delete(r.flushingIn, c)
		if r.afterFlush[c] {
			delete(r.afterFlush, c)
			again = append(again, c)
		}
		outs = append(outs, r.outcomesAfter[c]...)
		delete(r.outcomesAfter, c)
	}
	r.mu.Unlock()
	if again != nil {
		r.markDirty(again...)
	}
	if len(outs) > 0 {
		r.comp.mu.Lock()
		for _, q := range outs {
			r.comp.enqueue(q)
		}
		r.comp.mu.Unlock()
	}
}

// parkBehindFlush keeps q for the end of a flush of this node's in its
// conversation, if one is in flight besides the `own` ones (a flush that
// skipped q counts in flushingIn too): it holds the lock, or is about to,
// and takes q in before its claim (takeParked), or its end is the moment
// to try again (flushEnd queues q).
func (r *Runner) parkBehindFlush(q *queued, own int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.flushingIn[q.o.ConversationID] <= own {
		return false
	}
	r.outcomesAfter[q.o.ConversationID] = append(r.outcomesAfter[q.o.ConversationID], q)
	return true
}

// takeParked takes the outcomes parked behind flushes in the conversations
// locked (by the flush asking), oldest first per conversation, at most n,
// endings only if endingsOnly.
func (r *Runner) takeParked(locked []string, n int, endingsOnly bool) []*queued {
	if n <= 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*queued
	for _, conv := range locked {
		parked := r.outcomesAfter[conv]
		if len(parked) == 0 {
			continue
		}
		got, rest := take(parked, n-len(out), func(q *queued) bool { return !(endingsOnly && q.o.Kind == core.OutSpawn) })
		out = append(out, got...)
		if len(rest) == 0 {
			delete(r.outcomesAfter, conv)
		} else {
			r.outcomesAfter[conv] = rest
		}
	}
	return out
}
