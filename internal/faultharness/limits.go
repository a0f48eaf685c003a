package faultharness

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
)

// The proof of concurrency limits (docs/design.md §3.15): a scenario that
// sets limits (tasks.Engine.SetConcurrencyLimit) samples them while the
// work runs (SampleLimits) and, once every task settled, proves from the
// run log and the audit that no limit was exceeded and that no slot leaked
// (VerifyLimits).
//
// What "in flight" means. A run holds a slot of each limit of its keys
// from its start's commit to the commit of its end (task_slots). Its
// handler call is entered after the start committed, and does its work
// until it makes its ending write (Complete, Wait, a sleep…) or returns:
// a call is in flight from its entry to the earliest of its return, its
// run's end in the audit (the ending write's statement, inside the
// transaction that gives the slot back: the handler issued it before, and
// returns only after its commit, so the return would count the moments
// the next run of the key, started on that slot, overlaps the wrapper's
// last statement) and its process's death (a killed call does nothing
// after its process died; its slot stays held until the take-over's
// recovery, which is later still). So every call's interval lies within
// its run's slot, and at no moment can more calls of a key be in flight
// than its limit — which the sweep over the intervals checks. The raw
// intervals (entry to return, or to the kill) are swept too, for the
// figures, not asserted: they include that tail.
//
// The audit's own intervals (start to end of each run, stamped inside the
// transactions that take and give back the slot, which the limit's row
// lock orders) are the database's view of the same: swept and asserted
// as well.

// LimitSample is what SampleLimits saw of one limit.
type LimitSample struct {
	Max int
	// MaxRunning is the highest Running read (tasks.Engine.ConcurrencyLimits).
	MaxRunning int
	// Samples counts the reads; AtMax those that read Running = Max.
	Samples, AtMax int
}

// LimitSampler reads the concurrency limits while the work runs.
type LimitSampler struct {
	s    *Scenario
	stop chan struct{}
	done chan struct{}

	mu         sync.Mutex
	seen       map[string]*LimitSample
	violations []string
	errs       int
}

// SampleLimits starts reading the concurrency limits every interval until
// Stop: through the engine (tasks.Engine.ConcurrencyLimits: Running above
// Max is a violation) and, in one snapshot, each limit's running count
// against the running tasks whose slots name it and the running tasks of
// its key that do not name it (either mismatch is a violation: a slot
// leaked or given twice, a run started past the trigger). Errors of a read
// (a fault of the scenario's) skip it.
func (s *Scenario) SampleLimits(interval time.Duration) *LimitSampler {
	ls := &LimitSampler{s: s, stop: make(chan struct{}), done: make(chan struct{}), seen: map[string]*LimitSample{}}
	go func() {
		defer close(ls.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			ls.sample()
			select {
			case <-ls.stop:
				return
			case <-tick.C:
			}
		}
	}()
	s.T.Cleanup(func() { ls.Stop() })
	return ls
}

// limitSnapshotSQL reads, in one snapshot, each limit's count, the running
// tasks whose slots name it, and the running tasks of its key that do not.
const limitSnapshotSQL = `SELECT l.key, l.max, l.running,
	(SELECT count(*) FROM {s}.tasks t WHERE t.status = 'running' AND l.key = ANY(t.slots)) AS naming,
	(SELECT count(*) FROM {s}.tasks t WHERE t.status = 'running'
		AND l.key IN ('tenant:' || t.tenant, 'kind:' || t.kind, 'key:' || t.concurrency_key)
		AND NOT (l.key = ANY(coalesce(t.slots, '{}')))) AS unnamed
FROM {s}.concurrency_limits l ORDER BY l.key`

func (ls *LimitSampler) sample() {
	ctx, cancel := context.WithTimeout(ls.s.Ctx, 10*time.Second)
	defer cancel()
	limits, err := ls.s.Engine.ConcurrencyLimits(ctx)
	if err != nil {
		ls.mu.Lock()
		ls.errs++
		ls.mu.Unlock()
		return
	}
	now := time.Now().Format("15:04:05.000")
	ls.mu.Lock()
	for _, l := range limits {
		sm := ls.seen[l.Key]
		if sm == nil {
			sm = &LimitSample{}
			ls.seen[l.Key] = sm
		}
		sm.Max = l.Max
		sm.Samples++
		sm.MaxRunning = max(sm.MaxRunning, l.Running)
		if l.Running == l.Max {
			sm.AtMax++
		}
		if l.Running > l.Max {
			ls.violations = append(ls.violations, fmt.Sprintf("%s: limit %s read running %d > max %d", now, l.Key, l.Running, l.Max))
		}
	}
	ls.mu.Unlock()
	rows, err := ls.s.Pool.Query(ctx, ls.s.Q(limitSnapshotSQL))
	if err != nil {
		ls.mu.Lock()
		ls.errs++
		ls.mu.Unlock()
		return
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var maxN, running, naming, unnamed int
		if err := rows.Scan(&key, &maxN, &running, &naming, &unnamed); err != nil {
			break
		}
		if running != naming || unnamed != 0 || running > maxN {
			ls.mu.Lock()
			ls.violations = append(ls.violations, fmt.Sprintf("%s: limit %s counts %d running (max %d), %d running tasks name it, %d running tasks of its key do not",
				now, key, running, maxN, naming, unnamed))
			ls.mu.Unlock()
		}
	}
}

// Stop stops the sampling and returns what it saw of each limit, by key,
// and the violations it read.
func (ls *LimitSampler) Stop() (map[string]LimitSample, []string) {
	select {
	case <-ls.stop:
	default:
		close(ls.stop)
	}
	<-ls.done
	ls.mu.Lock()
	defer ls.mu.Unlock()
	out := map[string]LimitSample{}
	for k, v := range ls.seen {
		out[k] = *v
	}
	return out, slices.Clone(ls.violations)
}

// LimitFigures are what VerifyLimits found of one limit.
type LimitFigures struct {
	Max int
	// Calls counts the handler calls of the key's tasks in the run log.
	Calls int
	// InFlight is the most calls of the key in flight at once (from entry
	// to the earliest of return, run's end and kill); Raw the same from
	// entry to return or kill (a figure: see the note above); Held the
	// most runs holding a slot at once by the audit.
	InFlight, Raw, Held int
	// Sampled is what SampleLimits saw.
	Sampled LimitSample
	// Running is the limit's count once the work drained, and Naming the
	// running tasks whose slots name it then: both 0 when nothing leaked.
	Running, Naming int
}

// callsInFlightSQL sweeps the handler calls of each key ($1) over time:
// +1 at each entry, −1 at each end, entries before ends at the same
// moment (so that touching intervals count as overlapping), and returns
// each key's calls, most in flight at once and the moment it was first
// reached. end_at is a call's in-flight end (see the note above); raw_at
// its return, or its process's death.
const callsInFlightSQL = `WITH calls AS (
	SELECT r.id, r.started_at, t.tenant, t.kind, t.concurrency_key,
		coalesce(r.returned_at, k.from_at, 'infinity') AS raw_at,
		coalesce(least(r.returned_at, k.from_at,
			(SELECT min(a.at) FROM {s}.chaos_audit a WHERE a.task_id = r.task_id AND a.old_token = r.token
				AND a.old_status = 'running' AND (a.new_status <> 'running' OR a.new_token IS DISTINCT FROM r.token))), 'infinity') AS end_at
	FROM {s}.run_log r JOIN {s}.tasks t ON t.id = r.task_id
	LEFT JOIN {s}.chaos_faults k ON k.kind = 'kill' AND k.node = r.node),
keyed AS (
	SELECT c.*, l.key FROM calls c JOIN unnest($1::text[]) AS l(key)
		ON l.key IN ('tenant:' || c.tenant, 'kind:' || c.kind, 'key:' || c.concurrency_key)),
edges AS (
	SELECT key, id, started_at AS at, 1 AS d, 1 AS r FROM keyed
	UNION ALL SELECT key, id, end_at, -1, 0 FROM keyed
	UNION ALL SELECT key, id, raw_at, 0, -1 FROM keyed),
swept AS (
	SELECT key, at,
		sum(d) OVER (PARTITION BY key ORDER BY at, d DESC, id ROWS UNBOUNDED PRECEDING) AS n,
		sum(r) OVER (PARTITION BY key ORDER BY at, r DESC, id ROWS UNBOUNDED PRECEDING) AS raw
	FROM edges)
SELECT k.key, (SELECT count(*) FROM keyed c WHERE c.key = k.key),
	coalesce(max(w.n), 0), coalesce(max(w.raw), 0),
	coalesce((SELECT min(w2.at) FROM swept w2 WHERE w2.key = k.key AND w2.n = max(w.n)), 'epoch')
FROM unnest($1::text[]) AS k(key) LEFT JOIN swept w ON w.key = k.key
GROUP BY k.key ORDER BY k.key`

// slotsHeldSQL sweeps the runs of each key ($1) by the audit: from each
// start (→ running, stamped in the start's transaction, after its trigger
// took the slots) to its run's end (stamped in the transaction that gave
// them back), and returns the most held at once.
const slotsHeldSQL = `WITH runs AS (
	SELECT a.task_id, a.new_token AS token, a.at AS from_at,
		coalesce((SELECT min(d.at) FROM {s}.chaos_audit d WHERE d.task_id = a.task_id AND d.old_token = a.new_token
			AND d.old_status = 'running' AND (d.new_status <> 'running' OR d.new_token IS DISTINCT FROM a.new_token)), 'infinity') AS to_at
	FROM {s}.chaos_audit a WHERE a.new_status = 'running' AND a.old_status IS DISTINCT FROM 'running'),
keyed AS (
	SELECT r.*, l.key FROM runs r JOIN {s}.tasks t ON t.id = r.task_id JOIN unnest($1::text[]) AS l(key)
		ON l.key IN ('tenant:' || t.tenant, 'kind:' || t.kind, 'key:' || t.concurrency_key)),
edges AS (
	SELECT key, token, from_at AS at, 1 AS d FROM keyed
	UNION ALL SELECT key, token, to_at, -1 FROM keyed),
swept AS (
	SELECT key, sum(d) OVER (PARTITION BY key ORDER BY at, d DESC, token ROWS UNBOUNDED PRECEDING) AS n FROM edges)
SELECT k.key, coalesce(max(w.n), 0) FROM unnest($1::text[]) AS k(key) LEFT JOIN swept w ON w.key = k.key
GROUP BY k.key ORDER BY k.key`

// VerifyLimits is the limits' proof, once every task settled (after
// Verify, or before it): for each limit, by key,
//
//   - at no moment more calls of its key in flight than its max, swept
//     from the run log (callsInFlightSQL), nor more runs holding a slot,
//     swept from the audit (slotsHeldSQL);
//   - nothing the sampler read broke a limit, or its count (sampled);
//   - no slot leaked: its count is 0, and no running task names it;
//   - the proof is not empty: some calls of its key ran, and some reads
//     found it full.
//
// It logs the figures and returns them; what it finds fails the test
// (not fatally).
func (s *Scenario) VerifyLimits(sampled map[string]LimitSample, violations []string) map[string]LimitFigures {
	t := s.T
	t.Helper()
	out, problems := s.limitProblems(sampled, violations)
	for _, key := range slices.Sorted(maps.Keys(out)) {
		f := out[key]
		t.Logf("figures: limit %s (max %d): %d calls; most in flight at once %d (entry to return: %d); most slots held at once by the audit %d; sampled %d times, most running read %d, full in %d reads; slots leaked %d",
			key, f.Max, f.Calls, f.InFlight, f.Raw, f.Held, f.Sampled.Samples, f.Sampled.MaxRunning, f.Sampled.AtMax, f.Running)
	}
	assert.Empty(t, problems, "\n%s", strings.Join(problems, "\n"))
	return out
}

// limitProblems is VerifyLimits's proof: the figures of each limit, and
// what breaks a rule.
func (s *Scenario) limitProblems(sampled map[string]LimitSample, violations []string) (map[string]LimitFigures, []string) {
	s.T.Helper()
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	problems = append(problems, violations...)
	out := map[string]LimitFigures{}
	var keys []string
	s.Retry("limits", func(ctx context.Context) error {
		limits, err := s.Engine.ConcurrencyLimits(ctx)
		clear(out)
		keys = keys[:0]
		for _, l := range limits {
			out[l.Key] = LimitFigures{Max: l.Max, Running: l.Running, Sampled: sampled[l.Key]}
			keys = append(keys, l.Key)
		}
		return err
	})
	if len(keys) == 0 {
		add("no concurrency limit was set: the proof would be empty")
	}
	type swept struct {
		calls, n, raw int
		at            time.Time
	}
	inFlight := map[string]swept{}
	s.eachRow(callsInFlightSQL, func(rows pgx.Rows) error {
		var key string
		var w swept
		if err := rows.Scan(&key, &w.calls, &w.n, &w.raw, &w.at); err != nil {
			return err
		}
		inFlight[key] = w
		return nil
	}, keys)
	held := map[string]int{}
	s.eachRow(slotsHeldSQL, func(rows pgx.Rows) error {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return err
		}
		held[key] = n
		return nil
	}, keys)
	for _, key := range keys {
		f := out[key]
		w := inFlight[key]
		f.Calls, f.InFlight, f.Raw, f.Held = w.calls, w.n, w.raw, held[key]
		if f.InFlight > f.Max {
			add("limit %s (max %d): %d calls of its key in flight at once at %s", key, f.Max, f.InFlight, w.at.Format("15:04:05.000000"))
		}
		if f.Held > f.Max {
			add("limit %s (max %d): %d runs of its key held a slot at once, by the audit", key, f.Max, f.Held)
		}
		out[key] = f
	}
	for _, key := range keys {
		f := out[key]
		f.Naming = s.Count(`SELECT count(*) FROM {s}.tasks WHERE status = 'running' AND $1 = ANY(slots)`, key)
		out[key] = f
		if f.Running != 0 || f.Naming != 0 {
			add("limit %s: %d slots leaked (its count once the work drained; %d running tasks name it)", key, f.Running, f.Naming)
		}
		if f.Calls == 0 {
			add("limit %s: no call of its key ran: the proof would be empty", key)
		}
		if f.Sampled.Samples == 0 {
			add("limit %s: never sampled while the work ran", key)
		}
	}
	return out, problems
}

// eachRow runs a query (Q'd) and calls fn on each of its rows, again from
// the first row after an error (Retry).
func (s *Scenario) eachRow(sql string, fn func(rows pgx.Rows) error, args ...any) {
	s.T.Helper()
	s.Retry(sql, func(ctx context.Context) error {
		rows, err := s.Pool.Query(ctx, s.Q(sql), args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := fn(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}
