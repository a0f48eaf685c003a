package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// The soak (issue 14): a real machine.Runner with RunnerConfig{} runs for
// minutes while a producer keeps creating conversations and turns at a
// steady rate well under capacity, and prune keeps deleting the history
// that aged out; every interval the harness samples the tables' sizes,
// rows and dead tuples and the turns' latency, and at the end it says
// whether the last interval is flat against the one half-way through the
// steady part (after the warm-up).
// A benchmark answers "how fast"; the soak answers "does it stay that way,
// and does the database stay the same size" — what a deployment that
// keeps running needs to know.

// Defaults of SoakOptions.
const (
	SoakDurationDefault      = 4 * time.Minute
	SoakIntervalDefault      = 20 * time.Second
	SoakRateDefault          = 10.0
	SoakRetentionDefault     = time.Minute
	SoakPruneIntervalDefault = 5 * time.Second
	SoakThinkTimeDefault     = 8 * time.Second
	SoakJSONPathDefault      = "bench-results-soak.json"
)

// The workload's shape. A conversation takes 1 + (its number mod
// soakMaxTurns) turns, one after the other, with a think time between a
// turn's settle and the next; a turn reserves tokens against its own
// budget and the conversation's, publishes soakProgress progress entries,
// records what it used, makes soakToolCalls tool calls at once and waits
// on them (all_settled); one turn in soakAwaitEvery then awaits an event
// the producer emitted to it right after creating it. A tool call spends
// one "tool_calls" (the conversation's budget) and completes; in one turn
// in soakSleepEvery the first tool call sleeps soakSleep first (a wake job
// and a timer: River's table in the workload), a short sleep so that the
// turns' latency says what arbor adds rather than what the workload waits.
const (
	soakMaxTurns   = 3
	soakToolCalls  = 2
	soakProgress   = 3
	soakAwaitEvery = 3
	soakSleepEvery = 8
	soakSleep      = 50 * time.Millisecond
	// soakMeanTurns is the mean of 1 + n mod soakMaxTurns: the producer
	// starts Rate / soakMeanTurns conversations a second.
	soakMeanTurns = (soakMaxTurns + 1) / 2.0
	// soakTurnTimeout is how long the producer waits for a turn to
	// settle before counting it as timed out (a verdict failure).
	soakTurnTimeout = time.Minute
	// soakTasksPerTurn: the turn and its tool calls.
	soakTasksPerTurn = 1 + soakToolCalls
)

// SoakOptions configure Soak. The zero value of every field means its
// default.
type SoakOptions struct {
	// DatabaseURL is the database the soak runs in (a fresh schema of its
	// own, dropped at the end). Required.
	DatabaseURL string
	// Duration is how long the producer runs. Default SoakDurationDefault
	// (4 min).
	Duration time.Duration
	// Interval is how often the tables and the latencies are sampled.
	// Default SoakIntervalDefault (20 s).
	Interval time.Duration
	// Warmup is the time before the first interval the verdict compares
	// with the last: long enough for the first history to age out and for
	// the runner to release the first idle conversations. Default: the
	// retention or IdleRelease (1 min), whichever is longer, plus a
	// conversation's longest life (its think times) and two prune
	// intervals, rounded up to whole intervals (100 s with the defaults).
	Warmup time.Duration
	// Rate is the turns created per second, once the conversations' later
	// turns come in (new conversations start at Rate / 2 a second). Default
	// SoakRateDefault (10: about a fifth of this 2-core machine, client and
	// server together).
	Rate float64
	// Retention is tasks.Config.Retention: the runner's periodic prune job
	// (River's, the path a deployment uses) deletes settled history older
	// than it every PruneInterval. At least a minute, as the engine's
	// Config requires. Default SoakRetentionDefault (1 min). Ignored when
	// PruneOlderThan is set.
	Retention time.Duration
	// PruneInterval is tasks.Config.PruneInterval, or the pause between the
	// harness's own prunes when PruneOlderThan is set. Default
	// SoakPruneIntervalDefault (5 s).
	PruneInterval time.Duration
	// PruneOlderThan, when set, replaces the periodic job by the harness's
	// own loop of Engine.Prune(OlderThan: PruneOlderThan) every
	// PruneInterval (Retention is then left unset: the job prunes only the
	// log): for a retention shorter than the engine's Config accepts, as
	// the test of the soak needs. Default 0: the periodic job.
	PruneOlderThan time.Duration
	// ThinkTime is the longest a conversation waits between a turn's
	// settle and its next turn (each wait uniform in [ThinkTime/4,
	// ThinkTime]). Default SoakThinkTimeDefault (8 s).
	ThinkTime time.Duration
	// Conns is the number of connections of the runner's pool (plus the
	// few it keeps for its LISTEN and River). Default ConnsDefault (8).
	Conns int
	// Out receives the tables and the verdict. Default io.Discard.
	Out io.Writer
	// Logger receives progress and the runner's logs. Default: discard.
	Logger *slog.Logger
}

func (o *SoakOptions) withDefaults() *SoakOptions {
	out := *o
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&out.Duration, SoakDurationDefault)
	def(&out.Interval, SoakIntervalDefault)
	def(&out.Retention, SoakRetentionDefault)
	def(&out.PruneInterval, SoakPruneIntervalDefault)
	def(&out.ThinkTime, SoakThinkTimeDefault)
	if out.Rate == 0 {
		out.Rate = SoakRateDefault
	}
	if out.Conns == 0 {
		out.Conns = ConnsDefault
	}
	if out.Warmup == 0 && out.Interval > 0 {
		w := max(out.retention(), machine.IdleReleaseDefault) + (soakMaxTurns-1)*out.ThinkTime + 2*out.PruneInterval
		out.Warmup = (w + out.Interval - 1) / out.Interval * out.Interval
	}
	if out.Out == nil {
		out.Out = io.Discard
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return &out
}

// retention is the age at which history is pruned, by either path.
func (o *SoakOptions) retention() time.Duration {
	if o.PruneOlderThan > 0 {
		return o.PruneOlderThan
	}
	return o.Retention
}

func (o *SoakOptions) validate() error {
	switch {
	case o.DatabaseURL == "":
		return errors.New("SoakOptions.DatabaseURL: required")
	case o.Interval < 100*time.Millisecond:
		return fmt.Errorf("SoakOptions.Interval: %s is below 100ms", o.Interval)
	case o.Warmup < 0:
		return fmt.Errorf("SoakOptions.Warmup: %s is negative", o.Warmup)
	case o.Duration < o.Warmup+2*o.Interval:
		return fmt.Errorf("SoakOptions.Duration: %s leaves fewer than two intervals of %s after the warm-up of %s: nothing to compare",
			o.Duration, o.Interval, o.Warmup)
	case o.Rate <= 0 || o.Rate > 1000:
		return fmt.Errorf("SoakOptions.Rate: %g is outside (0, 1000] turns/s", o.Rate)
	case o.PruneOlderThan < 0:
		return fmt.Errorf("SoakOptions.PruneOlderThan: %s is negative", o.PruneOlderThan)
	case o.PruneOlderThan == 0 && o.Retention < time.Minute:
		return fmt.Errorf("SoakOptions.Retention: %s is below a minute, the least tasks.Config.Retention accepts (PruneOlderThan prunes sooner)", o.Retention)
	case o.PruneOlderThan == 0 && o.PruneInterval < time.Second:
		return fmt.Errorf("SoakOptions.PruneInterval: %s is below a second, the least tasks.Config.PruneInterval accepts", o.PruneInterval)
	case o.PruneInterval < 100*time.Millisecond:
		return fmt.Errorf("SoakOptions.PruneInterval: %s is below 100ms", o.PruneInterval)
	case o.ThinkTime < 0:
		return fmt.Errorf("SoakOptions.ThinkTime: %s is negative", o.ThinkTime)
	case o.Conns < 1 || o.Conns > 100:
		return fmt.Errorf("SoakOptions.Conns: %d is outside 1..100", o.Conns)
	}
	return nil
}

// Soak runs the soak that opts describe and returns its report, having
// printed each interval's table as it was sampled and the verdict at the
// end. It returns an error when the soak could not run (no database, bad
// options, the schema not migrated); a soak that ran and is not flat is
// a report with Flat false and the failed checks.
func Soak(ctx context.Context, opts SoakOptions) (*SoakReport, error) {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	started := time.Now()
	env, closeEnv, err := openEnv(ctx, o.DatabaseURL, o.Conns, o.Logger)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer closeEnv()
	mach, err := readMachine(ctx, env.Pool)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	rep := &SoakReport{Machine: mach, StartedAt: started.UTC(), Options: soakReportOptions(o)}
	var naptime int64
	if err := env.Pool.QueryRow(ctx, `SELECT current_setting('autovacuum'), setting::bigint FROM pg_settings WHERE name = 'autovacuum_naptime'`).
		Scan(&rep.Autovacuum, &naptime); err != nil {
		return nil, fmt.Errorf("soak: read the autovacuum settings: %w", err)
	}
	rep.AutovacuumNaptime = time.Duration(naptime) * time.Second
	printSoakHeader(o.Out, rep)

	schema, drop, err := newSchemaNamed(ctx, env.Pool, "arbor_soak")
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer drop()
	env.Schema, rep.Schema = schema, schema

	// The sampler reads through a pool of its own, outside the statement
	// counter: the counts are the workload's.
	scfg, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	scfg.MaxConns = 2
	statsPool, err := pgxpool.NewWithConfig(ctx, scfg)
	if err != nil {
		return nil, fmt.Errorf("soak: connect: %w", err)
	}
	defer statsPool.Close()

	logs := &soakLogState{}
	logger := slog.New(&soakLogHandler{inner: o.Logger.Handler(), state: logs})
	cfg := tasks.Config{Logger: logger}
	if o.PruneOlderThan == 0 {
		cfg.Retention, cfg.PruneInterval = o.Retention, o.PruneInterval
	}
	pool, eng, err := machinePoolWith(ctx, env, cfg)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer pool.Close()
	w := newSoakWorkload(eng, o, logs)
	r, err := machine.NewRunner(eng, w.handlers(), &machine.RunnerConfig{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	if err := r.Start(ctx); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer stopRunner(ctx, env, r)

	s := &soakSampler{env: env, pool: statsPool, o: o, w: w}
	base, err := s.sample(ctx, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	rep.Samples = append(rep.Samples, base)
	printSoakSample(o.Out, base)

	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { w.produce(ctx, stop) })
	if o.PruneOlderThan > 0 {
		bg.Go(func() { w.pruneLoop(ctx, stop) })
	}
	intervals := int(o.Duration / o.Interval)
	firstSteady := int(o.Warmup/o.Interval) + 1
	var steady *Window
	var sampleErr error
	for k := 1; k <= intervals && sampleErr == nil; k++ {
		if err := s.watchDead(ctx, s.start.Add(time.Duration(k)*o.Interval)); err != nil {
			sampleErr = err
			break
		}
		smp, err := s.sample(ctx, k, time.Duration(k)*o.Interval)
		if err != nil {
			sampleErr = err
			break
		}
		rep.Samples = append(rep.Samples, smp)
		printSoakSample(o.Out, smp)
		if k == firstSteady-1 {
			if steady, err = env.StartWindow(ctx); err != nil {
				sampleErr = err
			}
		}
	}
	var steadyM Measurement
	if sampleErr == nil && steady != nil {
		steadyM, sampleErr = steady.End(ctx)
	}
	close(stop)
	bg.Wait()
	// Turns in flight finish (each within soakTurnTimeout); no new one
	// starts.
	w.conversations.Wait()
	if sampleErr != nil {
		return nil, fmt.Errorf("soak: %w", sampleErr)
	}
	steadyTurns := 0
	for _, smp := range rep.Samples[firstSteady:] {
		steadyTurns += smp.Completed
	}
	rep.Steady = soakSteady(steadyM, steadyTurns)
	rep.End, err = w.finalCheck(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	rep.Verdict = soakVerdict(rep.Samples, firstSteady, rep.AutovacuumNaptime, rep.End)
	rep.Flat = rep.Verdict.Flat
	rep.Elapsed = time.Since(started)
	rep.PeakRSSBytes = peakRSS()
	printSoakEnd(o.Out, rep)
	return rep, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(max(0, d))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// soakWorkload is the producer and the handlers, and what they counted in
// the current interval.
type soakWorkload struct {
	eng  *tasks.Engine
	o    *SoakOptions
	logs *soakLogState

	signals       settleSignals
	conversations sync.WaitGroup
	// turns numbers the turns created, for the workload's choices.
	turns atomic.Int64

	mu  sync.Mutex
	cur soakBucket
	// Over the whole soak: turns that never settled, creates or emits
	// that failed (the first error's text kept), prunes that failed.
	timeouts, harnessErrors, pruneErrors int
	firstError                           string
	// created and completed count the turns of the whole soak, the drain
	// after the last sample included.
	created, completed int
}

// soakBucket is what one interval counted.
type soakBucket struct {
	created, completed, timeouts int
	latencies                    []time.Duration
	prunedConversations          int64
	prunedTurns, prunedTasks     int64
	prunes                       int64
}

func newSoakWorkload(eng *tasks.Engine, o *SoakOptions, logs *soakLogState) *soakWorkload {
	w := &soakWorkload{eng: eng, o: o, logs: logs}
	w.signals.init()
	logs.onPruned = w.pruned
	return w
}

// take returns the interval's counts and starts the next.
func (w *soakWorkload) take() soakBucket {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.cur
	w.cur = soakBucket{}
	return b
}

func (w *soakWorkload) pruned(conversations, turns, tasks int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur.prunes++
	w.cur.prunedConversations += conversations
	w.cur.prunedTurns += turns
	w.cur.prunedTasks += tasks
}

func (w *soakWorkload) harnessError(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.harnessErrors++
	if w.firstError == "" {
		w.firstError = err.Error()
	}
}

type soakTurnInput struct {
	Await bool `json:"await,omitempty"`
	Sleep bool `json:"sleep,omitempty"`
}

type soakToolInput struct {
	Sleep bool `json:"sleep,omitempty"`
}

// Phases of the soak's handlers.
const (
	soakPhaseTools    = "tools"
	soakPhaseApproved = "approved"
	soakPhaseSlept    = "slept"
	soakEvent         = "approve"
)

var (
	soakConversationBudgets = []arbortype.BudgetLimit{
		{Counter: "tool_calls", Max: 1 << 40},
		{Counter: "tokens", Max: 1 << 40},
	}
	soakTurnBudgets = []arbortype.BudgetLimit{{Counter: "tokens", Max: 100_000}}
)

func (w *soakWorkload) handlers() map[string]machine.Handler {
	complete := func(ctx context.Context, run *machine.Run) error {
		if err := run.Complete(ctx, json.RawMessage(`{"answer":"done"}`)); err != nil {
			return err
		}
		w.signals.settled(run.Task.ID)
		return nil
	}
	return map[string]machine.Handler{
		"turn": func(ctx context.Context, run *machine.Run) error {
			var in soakTurnInput
			if err := json.Unmarshal(run.Task.Input, &in); err != nil {
				return machine.NonRetryable(err)
			}
			switch run.Task.Phase {
			case soakPhaseTools:
				kids, err := run.Waited(ctx)
				if err != nil {
					return err
				}
				for _, k := range kids {
					if k.Status != arbortype.StatusCompleted {
						return machine.NonRetryable(fmt.Errorf("tool call %d is %s", k.ID, k.Status))
					}
				}
				if in.Await {
					return run.AwaitEvent(ctx, machine.AwaitParams{Name: soakEvent, Phase: soakPhaseApproved})
				}
				return complete(ctx, run)
			case soakPhaseApproved:
				return complete(ctx, run)
			}
			res, err := run.Reserve(ctx, "tokens", 2000)
			if err != nil {
				return err
			}
			for i := range soakProgress {
				if err := run.Progress(ctx, "token", json.RawMessage(fmt.Sprintf(`{"i":%d,"text":"streamed text"}`, i))); err != nil {
					return err
				}
			}
			if err := run.Record(ctx, res, 1200); err != nil {
				return err
			}
			ps := make([]machine.SpawnParams, soakToolCalls)
			for i := range ps {
				tin, _ := json.Marshal(soakToolInput{Sleep: in.Sleep && i == 0})
				ps[i] = machine.SpawnParams{Kind: "tool", Input: tin}
			}
			kids, err := run.SpawnMany(ctx, ps)
			if err != nil {
				return err
			}
			ids := make([]int64, len(kids))
			for i, k := range kids {
				ids[i] = k.ID
			}
			return run.Wait(ctx, machine.WaitParams{ChildIDs: ids, Policy: arbortype.AllSettled, Phase: soakPhaseTools})
		},
		"tool": func(ctx context.Context, run *machine.Run) error {
			if run.Task.Phase == soakPhaseSlept {
				return run.Complete(ctx, json.RawMessage(`{"out":"slept"}`))
			}
			var in soakToolInput
			if err := json.Unmarshal(run.Task.Input, &in); err != nil {
				return machine.NonRetryable(err)
			}
			if err := run.Spend(ctx, "tool_calls", 1); err != nil {
				return err
			}
			if in.Sleep {
				return run.SleepUntil(ctx, time.Now().Add(soakSleep), soakPhaseSlept, nil)
			}
			return run.Complete(ctx, json.RawMessage(`{"out":"tool output"}`))
		},
	}
}

// produce starts a conversation every soakMeanTurns / Rate seconds until
// stop.
func (w *soakWorkload) produce(ctx context.Context, stop <-chan struct{}) {
	every := time.Duration(float64(time.Second) * soakMeanTurns / w.o.Rate)
	next := time.Now()
	for n := 0; ; n++ {
		t := time.NewTimer(time.Until(next))
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		}
		w.conversations.Go(func() { w.conversation(ctx, stop, n) })
		next = next.Add(every)
	}
}

// conversation runs conversation n's turns, one after the other with a
// think time between them; at stop it finishes the turn in flight and
// starts no other.
func (w *soakWorkload) conversation(ctx context.Context, stop <-chan struct{}, n int) {
	conv := fmt.Sprintf("soak-%d", n)
	turns := 1 + n%soakMaxTurns
	for k := range turns {
		if k > 0 {
			think := w.o.ThinkTime/4 + rand.N(w.o.ThinkTime*3/4+1)
			t := time.NewTimer(think)
			select {
			case <-t.C:
			case <-stop:
				t.Stop()
				return
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		select {
		case <-stop:
			return
		default:
		}
		if !w.turn(ctx, conv, int(w.turns.Add(1))) {
			return
		}
	}
}

// turn creates turn number seq in conv, emits its event when it awaits
// one, and waits until it settled; it counts the turn in the current
// interval. false: the turn failed or timed out, and the conversation
// stops.
func (w *soakWorkload) turn(ctx context.Context, conv string, seq int) bool {
	in, _ := json.Marshal(soakTurnInput{Await: seq%soakAwaitEvery == 0, Sleep: seq%soakSleepEvery == 0})
	t, _, err := w.eng.Create(ctx, arbortype.CreateParams{ConversationID: conv, Kind: "turn", Input: in,
		Budgets: soakTurnBudgets, ConversationBudgets: soakConversationBudgets})
	if err != nil {
		w.harnessError(fmt.Errorf("create a turn in %s: %w", conv, err))
		return false
	}
	created := time.Now()
	settled := w.signals.await(t.ID)
	w.mu.Lock()
	w.cur.created++
	w.created++
	w.mu.Unlock()
	if seq%soakAwaitEvery == 0 {
		if _, _, err := w.eng.Emit(ctx, tasks.EmitParams{ConversationID: conv, TaskID: t.ID, Name: soakEvent,
			Payload: json.RawMessage(`{"approved":true}`)}); err != nil {
			w.harnessError(fmt.Errorf("emit to turn %d: %w", t.ID, err))
			return false
		}
	}
	timeout := time.NewTimer(soakTurnTimeout)
	defer timeout.Stop()
	select {
	case <-settled:
		lat := time.Since(created)
		w.mu.Lock()
		w.cur.completed++
		w.completed++
		w.cur.latencies = append(w.cur.latencies, lat)
		w.mu.Unlock()
		return true
	case <-timeout.C:
		w.mu.Lock()
		w.cur.timeouts++
		w.timeouts++
		w.mu.Unlock()
		return false
	case <-ctx.Done():
		return false
	}
}

// pruneLoop is the harness's own prune (SoakOptions.PruneOlderThan):
// Engine.Prune every PruneInterval until stop.
func (w *soakWorkload) pruneLoop(ctx context.Context, stop <-chan struct{}) {
	for {
		t := time.NewTimer(w.o.PruneInterval)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		}
		res, err := w.eng.Prune(ctx, tasks.PruneParams{OlderThan: w.o.PruneOlderThan})
		w.pruned(res.Conversations, res.Turns, res.Tasks)
		if err != nil && ctx.Err() == nil {
			w.mu.Lock()
			w.pruneErrors++
			w.mu.Unlock()
			w.logs.note(slog.LevelError, "bench: soak prune: "+err.Error())
		}
	}
}

// finalCheck, after the last turn settled, checks what is left: every
// task completed, the invariants (budgets' sums included) hold.
func (w *soakWorkload) finalCheck(ctx context.Context, env *Env) (SoakEnd, error) {
	var end SoakEnd
	if err := env.Pool.QueryRow(ctx, env.sql(`SELECT count(*) FILTER (WHERE status <> 'completed'), count(*) FROM {schema}.tasks`)).
		Scan(&end.TasksNotCompleted, &end.TasksLeft); err != nil {
		return end, fmt.Errorf("final check: %w", err)
	}
	vs, err := w.eng.Check(ctx)
	if err != nil {
		return end, fmt.Errorf("final check: %w", err)
	}
	end.Violations = len(vs)
	if len(vs) > 0 {
		end.FirstViolation = vs[0].String()
	}
	w.mu.Lock()
	end.Timeouts, end.HarnessErrors, end.PruneErrors, end.FirstHarnessError = w.timeouts, w.harnessErrors, w.pruneErrors, w.firstError
	end.TurnsCreated, end.TurnsCompleted = w.created, w.completed
	w.mu.Unlock()
	end.Warnings, end.Errors, end.FirstLogError = w.logs.counts()
	return end, nil
}

// settleSignals hands a turn's settle from its handler to the producer
// that waits for it, whichever comes first.
type settleSignals struct {
	mu      sync.Mutex
	waiting map[int64]chan struct{}
	early   map[int64]bool
}

func (s *settleSignals) init() {
	s.waiting, s.early = map[int64]chan struct{}{}, map[int64]bool{}
}

func (s *settleSignals) settled(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.waiting[id]; ok {
		close(ch)
		delete(s.waiting, id)
		return
	}
	s.early[id] = true
}

func (s *settleSignals) await(id int64) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if s.early[id] {
		delete(s.early, id)
		close(ch)
		return ch
	}
	s.waiting[id] = ch
	return ch
}

// soakLogState counts the warnings and errors the runner logged during the
// soak and passes the periodic prune job's counts ("arbor: pruned") on.
type soakLogState struct {
	warnings, errors atomic.Int64
	mu               sync.Mutex
	firstError       string
	onPruned         func(conversations, turns, tasks int64)
}

func (s *soakLogState) note(level slog.Level, msg string) {
	switch {
	case level >= slog.LevelError:
		s.errors.Add(1)
		s.mu.Lock()
		if s.firstError == "" {
			s.firstError = msg
		}
		s.mu.Unlock()
	case level >= slog.LevelWarn:
		s.warnings.Add(1)
	}
}

func (s *soakLogState) counts() (warnings, errors int64, first string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.warnings.Load(), s.errors.Load(), s.firstError
}

// soakLogHandler passes records on to inner (when inner takes their
// level) and counts them into state.
type soakLogHandler struct {
	inner slog.Handler
	state *soakLogState
}

func (h *soakLogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || h.inner.Enabled(ctx, l)
}

func (h *soakLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				msg += ": " + a.Value.String()
			}
			return true
		})
		h.state.note(r.Level, msg)
	}
	if r.Message == "arbor: pruned" && h.state.onPruned != nil {
		var c, turns, ts int64
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "conversations":
				c = a.Value.Int64()
			case "turns":
				turns = a.Value.Int64()
			case "tasks":
				ts = a.Value.Int64()
			}
			return true
		})
		h.state.onPruned(c, turns, ts)
	}
	if !h.inner.Enabled(ctx, r.Level) {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

func (h *soakLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &soakLogHandler{inner: h.inner.WithAttrs(as), state: h.state}
}

func (h *soakLogHandler) WithGroup(name string) slog.Handler {
	return &soakLogHandler{inner: h.inner.WithGroup(name), state: h.state}
}
