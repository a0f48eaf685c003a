package machine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/recovery"
	"github.com/arborhq/arbor/internal/store"
	"github.com/arborhq/arbor/reconcile"
)

// producer is the runner's producer service: it starts work while worker
// slots are free — claims across the held conversations, and opens
// conversations with work and no holder — when told (a notification, a
// handler that returned, a flush) and on every PollInterval; and it
// releases conversations idle past IdleRelease.
//
// Its own state is what it has been told: the held conversations that may
// have work (dirty), the unheld ones the change channel named (news), and
// three wants (every held conversation, a scan for unheld ones, a reopen
// of lapsed ones). What the node holds and runs is the Runner's. Its mutex
// is taken after the Runner's, never before it: a caller that decides by
// what the node holds (held → dirty, unheld → news) does so under both,
// as one step.
type producer struct {
	r    *Runner
	kick chan struct{} // the producer's wake-up

	mu         sync.Mutex
	dirty      map[string]bool // held conversations that may have work to claim
	news       map[string]bool // conversations not held here that the change channel named
	wantHeld   bool            // any held conversation may have work (the slow poll)
	wantOpen   bool            // a conversation with no holder may have work
	wantReopen bool            // lapsed conversations wait for a reopen
}

func newProducer(r *Runner) *producer {
	return &producer{
		r:        r,
		kick:     make(chan struct{}, 1),
		dirty:    map[string]bool{},
		news:     map[string]bool{},
		wantHeld: true,
		wantOpen: true,
	}
}

// poke wakes the producer (at once if it is idle, after its pass if not).
func (p *producer) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// addNews marks an unheld conversation as named by the change channel
// (under p.mu); past maxNews, the producer scans instead.
func (p *producer) addNews(conv string) {
	if len(p.news) < maxNews {
		p.news[conv] = true
	} else {
		p.wantOpen = true
	}
}

// set sets the wants given true (a scan of the held conversations, of the
// unheld ones, a reopen) and pokes the producer.
func (p *producer) set(held, open, reopen bool) {
	p.mu.Lock()
	p.wantHeld = p.wantHeld || held
	p.wantOpen = p.wantOpen || open
	p.wantReopen = p.wantReopen || reopen
	p.mu.Unlock()
	p.poke()
}

// run is the producer's loop, until ctx ends.
func (p *producer) run(ctx context.Context) {
	r := p.r
	tick := time.NewTicker(r.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
			p.mu.Lock()
			p.wantHeld, p.wantOpen = true, true
			p.mu.Unlock()
			r.releaseIdle(time.Now())
		}
		p.once()
	}
}

// once claims and opens until there is nothing more to do or no free
// slot; a slot given back later pokes the producer again. Claims come
// first: in the conversations marked dirty (a notification, a flush that
// ran out of slots), or, on the slow poll, across every held one; then
// conversations with work and no holder are opened.
func (p *producer) once() {
	r := p.r
	for r.runCtx.Err() == nil {
		// Nothing is claimed or opened while the node's lease is not
		// confirmed: what a claim took could not be run.
		if !r.lease.usable(time.Now()) {
			return
		}
		r.mu.Lock()
		if r.stopping {
			r.mu.Unlock()
			return
		}
		p.mu.Lock()
		if p.wantReopen {
			p.wantReopen = false
			p.mu.Unlock()
			r.mu.Unlock()
			r.reopen()
			continue
		}
		var dirty []string
		if len(p.dirty) > 0 && !p.wantHeld {
			dirty = make([]string, 0, len(p.dirty))
			for c := range p.dirty {
				dirty = append(dirty, c)
			}
			p.dirty = map[string]bool{}
		}
		var news []string
		if len(p.news) > 0 {
			news = make([]string, 0, len(p.news))
			for c := range p.news {
				news = append(news, c)
			}
			slices.Sort(news)
			p.news = map[string]bool{}
		}
		wantHeld, wantOpen := p.wantHeld, p.wantOpen
		if wantHeld {
			p.dirty = map[string]bool{}
		}
		if news != nil {
			// The named conversations first (by primary key); the scan,
			// which finds what no notification named, after them.
			wantOpen = false
		}
		deferScan := p.wantOpen && news != nil
		p.wantHeld, p.wantOpen = false, deferScan
		p.mu.Unlock()
		r.mu.Unlock()
		if !wantHeld && !wantOpen && dirty == nil && news == nil {
			return
		}
		more := false
		if wantHeld || dirty != nil {
			full, noSlot := r.claimHeld(dirty)
			if noSlot || full {
				r.mu.Lock()
				p.mu.Lock()
				if wantHeld {
					p.wantHeld = true
				}
				for _, c := range dirty {
					if r.held[c] != nil {
						p.dirty[c] = true
					}
				}
				p.wantOpen = p.wantOpen || (noSlot && wantOpen)
				p.mu.Unlock()
				r.mu.Unlock()
			}
			if noSlot {
				return
			}
			more = more || full
		}
		if wantOpen || news != nil {
			full, noSlot := r.open(news)
			if noSlot || (full && wantOpen) {
				r.mu.Lock()
				p.mu.Lock()
				if wantOpen {
					p.wantOpen = true
				}
				for _, c := range news {
					if noSlot && r.held[c] == nil {
						p.news[c] = true
					}
				}
				p.mu.Unlock()
				r.mu.Unlock()
			}
			if noSlot {
				return
			}
			more = more || full || deferScan
		}
		if !more {
			return
		}
	}
}

// claimHeld claims runnable tasks in the held conversations convs (nil:
// across every held one), for the free slots. full says the claim took
// every slot (there may be more work); noSlot that there was no slot to
// claim with.
func (r *Runner) claimHeld(convs []string) (full, noSlot bool) {
	k := r.reserveForClaim()
	if k == 0 {
		return false, true
	}
	defer r.claimed(k)
	p := r.claimParams(k)
	var (
		xact         int64
		work, locked []string
	)
	r.claimMu.RLock()
	claimed, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) ([]arbortype.Task, error) {
		p.Conversations = nil
		if convs != nil {
			// The conversations another transaction holds (a flush, a
			// user's operation) are skipped by the claim's SKIP LOCKED, and
			// no notification says when they are free: they are looked at
			// again shortly. Those with no pending task are not locked at
			// all (docs/architecture.md: an ending does not wait behind a
			// claim with nothing to claim).
			var err error
			if work, locked, err = r.core.LockHeld(r.runCtx, tx, p.Holder, convs); err != nil || len(locked) == 0 {
				return nil, err
			}
			p.Conversations = locked
		}
		claimed, x, err := r.core.ClaimFor(r.runCtx, tx, p)
		xact = x
		if err == nil && len(claimed) > 0 {
			err = r.fencedClaim()
		}
		return claimed, err
	})
	if err != nil {
		r.claimMu.RUnlock()
		r.unreserve(k)
		r.claimFailed(err, xact, "claiming tasks")
		return false, false
	}
	r.unreserve(k - len(claimed))
	r.dispatch(claimed)
	r.claimMu.RUnlock()
	r.announceRuns(claimed)
	if convs != nil && len(locked) < len(work) {
		r.retrySkipped(work, locked)
	}
	return len(claimed) == k, false
}

// skippedRetry is how soon the producer looks again at held conversations
// a claim skipped because another transaction held them.
const skippedRetry = 5 * time.Millisecond

// retrySkipped marks dirty again the conversations among convs (sorted
// locked aside) that a claim could not lock, and pokes the producer after
// skippedRetry. One that a flush of this node's holds is not polled: it is
// claimed in when that flush is over (flushEnd), so a busy conversation,
// locked flush after flush, costs no claim every few milliseconds.
func (r *Runner) retrySkipped(convs, locked []string) {
	got := make(map[string]bool, len(locked))
	for _, c := range locked {
		got[c] = true
	}
	p := r.prod
	r.mu.Lock()
	p.mu.Lock()
	n := 0
	for _, c := range convs {
		switch {
		case got[c]:
		case r.held[c] == nil:
			// Released meanwhile (releaseLeases marked it news).
		case r.flushingIn[c] > 0:
			r.afterFlush[c] = true
		default:
			p.dirty[c] = true
			n++
		}
	}
	p.mu.Unlock()
	r.mu.Unlock()
	if n > 0 {
		time.AfterFunc(skippedRetry, p.poke)
	}
}

func (r *Runner) claimParams(limit int) core.ClaimParamsFor {
	holderID, _ := r.lease.holder()
	r.mu.Lock()
	busy := r.busyByTenant()
	r.mu.Unlock()
	return core.ClaimParamsFor{Holder: holderID, Kinds: r.kinds, GenerationKinds: r.cfg.GenerationKinds, Limit: limit,
		Busy: busy, Claimed: r.claimedRuns}
}

// busyByTenant counts the runs that hold a worker slot, by tenant: where
// the fair claim starts from (under r.mu).
func (r *Runner) busyByTenant() store.Busy {
	var b store.Busy
	at := map[string]int{}
	for _, a := range r.runs {
		if !a.slot {
			continue
		}
		i, ok := at[a.run.Task.Tenant]
		if !ok {
			i = len(b.Tenants)
			at[a.run.Task.Tenant] = i
			b.Tenants, b.Runs = append(b.Tenants, a.run.Task.Tenant), append(b.Runs, 0)
		}
		b.Runs[i]++
	}
	return b
}

// openBatch bounds the conversations one open takes: an open is one
// transaction, and a notification's conversation (another tenant's next
// turn) waits for the open in flight to end; an open of a thousand
// conversations behind a flood of one-task turns took hundreds of
// milliseconds (bench (m)).
const openBatch = 100

// open takes conversations that have work and no live holder — as many as
// there are free slots and room — recovers them, and claims their runnable
// tasks, all in one transaction. When the node is full, the longest idle
// conversations are released first to make room.
func (r *Runner) open(named []string) (full, noSlot bool) {
	k := r.reserveForClaim()
	if k == 0 {
		return false, true
	}
	defer r.claimed(k)
	r.mu.Lock()
	room := r.cfg.Capacity - len(r.held)
	r.mu.Unlock()
	// Idle conversations are released for room only as far as it is
	// needed: for the named conversations, as many as they are; for a scan,
	// which cannot know, a few at a time once the node is full.
	want := k
	if named != nil {
		want = min(k, len(named))
	}
	if room < want && (named != nil || room <= 0) {
		n, err := core.Read(r.runCtx, r.core, func(db store.DB) (int, error) {
			return r.core.CountOpenable(r.runCtx, db, r.kinds, min(want, room+evictBatch), named)
		})
		if err == nil && n > room {
			room += r.releaseForRoom(min(n-room, evictBatch))
		}
	}
	limit := min(k, room, openBatch)
	if limit <= 0 {
		r.unreserve(k)
		return false, false
	}
	type opened struct {
		after   *string
		leases  []core.Lease
		reps    []reconcile.Report
		claimed []arbortype.Task
	}
	var xact int64
	r.claimMu.RLock()
	defer r.claimMu.RUnlock()
	holderID, ownLives := r.lease.holder()
	r.mu.Lock()
	after, busy := r.openAfter, r.busyByTenant()
	r.mu.Unlock()
	o, err := core.Tx(r.runCtx, r.core, func(tx pgx.Tx) (opened, error) {
		var o opened
		op, err := r.core.OpenConversations(r.runCtx, tx, r.cfg.NodeID, holderID, r.kinds, limit, named, after, busy)
		xact, o.leases, o.after = op.Xact, op.Leases, op.NextAfter
		if err != nil || len(o.leases) == 0 {
			return o, err
		}
		convs := make([]string, len(o.leases))
		for i, l := range o.leases {
			convs[i] = l.ConversationID
		}
		// Recovery only where it has something to look at; the others get
		// an empty report. A take-over counts restarts only from a holder
		// that lapsed (not from this process's own earlier lives, nor one
		// lapsed by a database restart).
		reps, err := recovery.OnOpenMany(r.runCtx, r.core, tx, op.Recover, func(c string) bool { return op.Taken[c].Counted(ownLives...) }, r.uncalled)
		if err != nil {
			return o, err
		}
		byConv := make(map[string]reconcile.Report, len(reps))
		for _, rep := range reps {
			byConv[rep.ConversationID] = rep
		}
		o.reps = make([]reconcile.Report, len(convs))
		for i, c := range convs {
			o.reps[i] = byConv[c]
			o.reps[i].ConversationID = c
		}
		p := r.claimParams(k)
		p.Conversations = convs
		o.claimed, _, err = r.core.ClaimFor(r.runCtx, tx, p)
		if err == nil {
			err = r.fencedClaim()
		}
		return o, err
	})
	if err != nil {
		r.unreserve(k)
		if errors.Is(err, arbortype.ErrAmbiguous) {
			go r.claimFailed(err, xact, "opening conversations") // adopt waits for claimMu
		} else {
			r.claimFailed(err, 0, "opening conversations")
		}
		return false, false
	}
	now := time.Now()
	r.mu.Lock()
	for _, l := range o.leases {
		r.hold(l, now)
	}
	r.openAfter = o.after
	r.mu.Unlock()
	var took takeOver
	for i, rep := range o.reps {
		if !rep.Empty() {
			took.add(rep)
			r.logger.Debug("arbor: conversation recovered", slog.Any("report", rep), slog.Int64("epoch", o.leases[i].Epoch))
		}
		r.reconciled(rep)
		if r.cfg.Observer != nil && !rep.Empty() {
			r.cfg.Observer.Observe(Observation{Kind: ObservedTakeOver, Report: rep})
		}
	}
	took.log(r.logger)
	r.unreserve(k - len(o.claimed))
	r.dispatch(o.claimed)
	r.announceRuns(o.claimed)
	p := r.prod
	r.mu.Lock()
	defer r.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(o.claimed) == k {
		for _, l := range o.leases {
			p.dirty[l.ConversationID] = true // the slots ran out first
		}
	}
	full = len(o.leases) == limit
	if full && named != nil {
		// The limit cut the list: those not looked at go back. (Those
		// looked at and not taken had no work, or another node took them.)
		last := o.leases[len(o.leases)-1].ConversationID
		for _, c := range named {
			if c > last && r.held[c] == nil {
				p.news[c] = true
			}
		}
	}
	return full, false
}

// takeOver sums what the recoveries of one open did, for its one log line.
type takeOver struct {
	conversations                                           int
	requeued, restarted, abandoned, limitExceeded, repaired int
}

func (t *takeOver) add(rep reconcile.Report) {
	t.conversations++
	t.requeued += len(rep.Requeued)
	t.restarted += len(rep.Restarted)
	t.abandoned += len(rep.Abandoned)
	t.limitExceeded += len(rep.LimitExceeded)
	t.repaired += len(rep.WaitsWoken) + len(rep.Completed)
}

// log writes one line at Info for an open that recovered anything: how
// many conversations, tasks requeued, restarts counted, tasks abandoned
// and failed past their restart limit, waits and completions repaired
// (each conversation's report is at Debug, and goes to OnReconcile).
func (t takeOver) log(logger *slog.Logger) {
	if t.conversations == 0 {
		return
	}
	logger.Info("arbor: took over conversations", slog.Int("conversations", t.conversations),
		slog.Int("requeued", t.requeued), slog.Int("restarts_counted", t.restarted), slog.Int("abandoned", t.abandoned),
		slog.Int("restart_limit_exceeded", t.limitExceeded), slog.Int("repaired", t.repaired))
}

// announceRuns tells the conversations' log followers of the runs a claim
// started (its transaction did not announce them).
func (r *Runner) announceRuns(claimed []arbortype.Task) {
	if len(claimed) == 0 {
		return
	}
	convs := make([]string, len(claimed))
	for i, t := range claimed {
		convs[i] = t.ConversationID
	}
	r.core.AnnounceLog(convs...)
}

// claimFailed handles a claim or open that failed. One whose commit's
// answer was lost is resolved: if it committed, what it took (leases, runs)
// is adopted.
func (r *Runner) claimFailed(err error, xact int64, what string) {
	if r.runCtx.Err() != nil {
		return
	}
	if errors.Is(err, errFencedClaim) {
		// Rolled back: the renewal that confirms the lease again asks for
		// the held claim and the reopen; the scan finds what an open took.
		r.markOpen()
		return
	}
	if !errors.Is(err, arbortype.ErrAmbiguous) || xact == 0 {
		r.logger.Warn("arbor: "+what+" failed", slog.String("error", err.Error()))
		return
	}
	committed, rerr := resolveXact(r.runCtx, r, xact)
	switch {
	case rerr != nil:
		r.logger.Warn("arbor: "+what+": the commit stayed unknown; what it took is adopted once the database answers",
			slog.String("error", rerr.Error()))
		r.unresolved.Store(true)
	case committed:
		r.adopt(r.runCtx, nil)
	}
	r.markHeld()
	r.markOpen()
}
