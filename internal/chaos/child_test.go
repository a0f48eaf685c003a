package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/faultharness"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// Environment of a runner process.
const (
	envChild  = "ARBOR_CHAOS_CHILD"
	envSchema = "ARBOR_CHAOS_SCHEMA"
	envNode   = "ARBOR_CHAOS_NODE"
	envLease  = "ARBOR_CHAOS_LEASE"
	// envArborURL, when set, is the database URL of arbor's pool in the
	// runner process (a route through the test's fault proxy); the run log
	// and the side effects always go to testdb.EnvURL directly.
	envArborURL = "ARBOR_CHAOS_ARBOR_URL"
	// envHog makes the test binary a CPU hog: that many goroutines busy
	// looping, on as many threads, until its stdin closes.
	envHog = "ARBOR_CHAOS_HOG"
	// envCreate, when set, is how many conversations the runner process
	// creates itself while its runner runs (createTurns): turns its
	// creates may start (docs/design.md §3.18).
	envCreate = "ARBOR_CHAOS_CREATE"
)

// appPrefix starts the application_name of every runner process's arbor
// connections ("arbor-chaos-" + node): what test (b) terminates by, and
// what the audit trigger records as the writer of each row version.
// logPrefix starts that of its run log's pool, which is not arbor's: no
// fault but a server restart touches it.
const (
	appPrefix = "arbor-chaos-"
	logPrefix = "chaos-log-"
)

// Runner settings of every runner process: a short conversation lease (a
// killed or frozen runner's conversations are taken over two seconds
// later: the lease issue 19 measured with, short enough for the faults to
// bite, long enough that a starved node at load 10 renews in time)
// and short polls.
const (
	leaseDefault = 2 * time.Second
	pollInterval = 50 * time.Millisecond
	workers      = 32
	poolConns    = 16
	taskLease    = 5 * time.Second
	// idleInTx is below the lease, as tasks.Config.IdleInTransaction asks:
	// a frozen runner's open transactions end within it, so that they do
	// not keep its conversations from the take-over.
	idleInTx  = time.Second
	childLife = 10 * time.Minute // a runner left behind by a broken test ends by itself
)

// runChild is a runner process: a Runner with the workload's handlers on
// the schema it is given, until SIGTERM (a graceful Stop), SIGKILL, its
// stdin closing (the test process died) or childLife. It prints
// "runner started" once it runs, and logs (JSON) to stderr.
func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, childLife)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3) // the test process is gone
	}()
	schema, node := os.Getenv(envSchema), os.Getenv(envNode)
	lease, err := time.ParseDuration(os.Getenv(envLease))
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease:", err)
		return 1
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	arborURL := os.Getenv(envArborURL)
	if arborURL == "" {
		arborURL = os.Getenv(testdb.EnvURL)
	}
	pool, err := childPool(ctx, arborURL, appPrefix+node)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	logs, err := childPool(ctx, os.Getenv(testdb.EnvURL), logPrefix+node)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer logs.Close()
	// The engine's default restart limit, as an application's.
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TaskLease: taskLease,
		IdleInTransaction: idleInTx, Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w := faultharness.NewWorker(logs, schema, node, engine)
	// The record's statements still on their way land before the pool
	// closes (each gives up after two minutes).
	defer w.Wait()
	runner, err := machine.NewRunner(engine, w.Handlers(), &machine.RunnerConfig{
		NodeID:            node,
		Workers:           workers,
		ConversationLease: lease,
		PollInterval:      pollInterval,
		IdleRelease:       300 * time.Millisecond,
		ShutdownGrace:     5 * time.Second,
		Waker:             &machine.WakerConfig{RiverTestOnly: true},
		Logger:            logger,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := runner.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("runner started", node)
	if v := os.Getenv(envCreate); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, envCreate, err)
			return 1
		}
		go createTurns(ctx, engine, logs, schema, node, n)
	}
	<-ctx.Done()
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	if err := runner.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "stop:", err)
		return 1
	}
	return 0
}

// createLogDDL is the record of the creates of runner processes that
// create their own turns (createTurns), on their run log's pool: a row per
// conversation, written before its create is sent (intended_at), and
// completed with what the create returned (returned_at: the task's status
// and id and whether this call created it, or the error: "ambiguous" for
// arbortype.ErrAmbiguous). A row with no returned_at is a create whose
// caller died before it knew the outcome (or before it recorded it).
const createLogDDL = `CREATE TABLE {s}.create_log (
	conversation_id text PRIMARY KEY,
	i               integer NOT NULL,
	node            text NOT NULL,
	via             text NOT NULL,
	intended_at     timestamptz NOT NULL,
	returned_at     timestamptz,
	status          text,
	task_id         bigint,
	created         boolean,
	error           text)`

// createTurns is a runner process's own work: n conversations of one
// turn (faultharness.TurnCreate), named after the node, created on the
// runner's engine — so that the runner may start them in their creates —
// one by one with Create, or two or three at a time with CreateMany (about
// a third of the calls), 40 to 120 ms apart. Before each call it records
// its conversations in create_log and prints "creating" (what the test
// times its kills by); after it, what it returned. It prints "creates
// done" at the end. It makes no second try: the test issues every create
// again, with its key, once the faults are over.
func createTurns(ctx context.Context, engine *tasks.Engine, logs *pgxpool.Pool, schema, node string, n int) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	for j := 0; j < n && ctx.Err() == nil; {
		k, via := 1, "create"
		if rng.IntN(3) == 0 {
			k, via = min(2+rng.IntN(2), n-j), "create_many"
		}
		ps := make([]arbortype.CreateParams, k)
		for x := range k {
			ps[x] = faultharness.TurnCreate(fmt.Sprintf("%s-%03d", node, j+x), j+x)
			if _, err := logs.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.create_log (conversation_id, i, node, via, intended_at)
				VALUES ($1, $2, $3, $4, $5)`, schema), ps[x].ConversationID, j+x, node, via, time.Now()); err != nil {
				fmt.Fprintln(os.Stderr, "create_log:", err)
				return
			}
		}
		j += k
		fmt.Println("creating", ps[0].ConversationID)
		var ts []arbortype.Task
		var created []bool
		var err error
		if via == "create" {
			var t arbortype.Task
			var c bool
			t, c, err = engine.Create(ctx, ps[0])
			ts, created = []arbortype.Task{t}, []bool{c}
		} else {
			ts, created, err = engine.CreateMany(ctx, ps)
		}
		returned := time.Now()
		for x, p := range ps {
			var status, msg *string
			var id *int64
			var c *bool
			switch {
			case errors.Is(err, arbortype.ErrAmbiguous):
				m := "ambiguous"
				msg = &m
			case err != nil:
				m := err.Error()
				msg = &m
			case x < len(ts):
				st := string(ts[x].Status)
				status, id, c = &st, &ts[x].ID, &created[x]
			}
			if _, err := logs.Exec(context.Background(), fmt.Sprintf(`UPDATE %s.create_log
				SET returned_at = $2, status = $3, task_id = $4, created = $5, error = $6 WHERE conversation_id = $1`, schema),
				p.ConversationID, returned, status, id, c, msg); err != nil {
				fmt.Fprintln(os.Stderr, "create_log:", err)
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(40+rng.IntN(81)) * time.Millisecond):
		}
	}
	fmt.Println("creates done")
}

// childPool opens a pool of a runner process, its connections named app.
func childPool(ctx context.Context, url, app string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = poolConns
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	return pgxpool.NewWithConfig(ctx, cfg)
}

// runHog busy-loops on n threads until the test process closes its stdin
// (or it is killed): load beside the runners, as a busy host has.
func runHog(n int) int {
	runtime.GOMAXPROCS(n)
	for range n {
		go func() {
			x := uint64(1)
			for {
				x = x*6364136223846793005 + 1442695040888963407
				if x == 0 {
					fmt.Println(x) // never: keeps the loop from being optimised away
				}
			}
		}()
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// startHog starts a CPU hog process of n busy threads, killed when the
// test ends or by stopHog.
func (s *scenario) startHog(n int) (stopHog func()) {
	t := s.T
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", envHog, n))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	stopHog = func() {
		once.Do(func() {
			_ = stdin.Close()
			_ = cmd.Process.Kill()
			<-done
		})
	}
	t.Cleanup(stopHog)
	return stopHog
}

// child is a runner process: this test binary re-executed.
type child struct {
	node  string
	out   *startedWriter // its stdout
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   string // its stderr
	done  chan struct{}
	err   error // Wait's, once done is closed
}

// startedWriter watches a child's stdout for its "runner started" line,
// and, in a child that creates its own turns (createTurns), for its
// "creating" lines — each sent on creating to a receiver waiting at that
// moment, none kept for later — and its "creates done".
type startedWriter struct {
	mu          sync.Mutex
	buf         bytes.Buffer
	started     chan struct{}
	once        sync.Once
	creating    chan struct{}
	createsDone chan struct{}
	doneOnce    sync.Once
}

func (w *startedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), "runner started") {
		w.once.Do(func() { close(w.started) })
	}
	if bytes.Contains(p, []byte("creating ")) {
		select {
		case w.creating <- struct{}{}:
		default:
		}
	}
	if bytes.Contains(p, []byte("creates done")) {
		w.doneOnce.Do(func() { close(w.createsDone) })
	}
	return len(p), nil
}

// startChild starts a runner process named node (its application_name is
// appPrefix+node) with the given conversation lease, and waits until its
// runner runs.
func (s *scenario) startChild(node string, lease time.Duration) *child {
	s.T.Helper()
	return s.startChildVia(node, lease, "")
}

// startChildVia is startChild with arbor's pool on url (a route through
// the fault proxy), "" for the database itself.
func (s *scenario) startChildVia(node string, lease time.Duration, url string) *child {
	s.T.Helper()
	return s.launch(node, lease, url, 0)
}

// startCreatingChild is startChild for a runner process that also creates
// n conversations of its own (createTurns; create_log must exist).
func (s *scenario) startCreatingChild(node string, lease time.Duration, n int) *child {
	s.T.Helper()
	return s.launch(node, lease, "", n)
}

// launch starts a runner process (startChildVia), creating n
// conversations of its own when n > 0 (createTurns).
func (s *scenario) launch(node string, lease time.Duration, url string, n int) *child {
	t := s.T
	t.Helper()
	c := &child{node: node, log: filepath.Join(s.LogDir, node+".log"), done: make(chan struct{})}
	logFile, err := os.Create(c.log)
	require.NoError(t, err)
	defer logFile.Close() // the child has its own descriptor
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), envChild+"=1", envSchema+"="+s.Schema, envNode+"="+node, envLease+"="+lease.String())
	if url != "" {
		c.cmd.Env = append(c.cmd.Env, envArborURL+"="+url)
	}
	if n > 0 {
		c.cmd.Env = append(c.cmd.Env, fmt.Sprintf("%s=%d", envCreate, n))
	}
	c.cmd.Stderr = logFile
	out := &startedWriter{started: make(chan struct{}), creating: make(chan struct{}), createsDone: make(chan struct{})}
	c.out = out
	c.cmd.Stdout = out
	c.stdin, err = c.cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
	})
	s.children = append(s.children, c)
	s.AddRunnerLog(node, c.log)
	select {
	case <-out.started:
	case <-c.done:
		require.FailNow(t, "runner process did not start", "%s: %v; its log:\n%s", node, c.err, faultharness.Tail(c.log, 40))
	case <-time.After(time.Minute):
		require.FailNow(t, "runner process did not start within a minute", "%s; its log:\n%s", node, faultharness.Tail(c.log, 40))
	}
	return c
}

// kill kills the child with SIGKILL, waits for it to be gone and records
// the moment in chaos_faults: no call of it lasts beyond.
func (s *scenario) kill(c *child) {
	s.T.Helper()
	require.NoError(s.T, c.cmd.Process.Signal(syscall.SIGKILL))
	<-c.done
	at := time.Now()
	s.Fault("kill", c.node, "", at, at)
}

// stop asks the child to shut down gracefully and requires a clean exit:
// its runner stopped with every handler returned and every lease released.
func (s *scenario) stop(c *child) {
	s.T.Helper()
	require.NoError(s.T, c.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		require.FailNow(s.T, "runner process did not stop within a minute", "%s; its log:\n%s", c.node, faultharness.Tail(c.log, 40))
	}
	require.NoError(s.T, c.err, "runner %s stops cleanly; its log:\n%s", c.node, faultharness.Tail(c.log, 40))
}

// freeze stops the child with SIGSTOP, waits until the kernel says it is
// stopped, and returns the moment it sent the signal and the moment it saw
// the child stopped. The child may still run between the two (the signal
// is delivered when the kernel next schedules it): a call it entered then
// was in flight at the freeze although it entered after the signal was
// sent; nothing of the child ran after the second.
func (s *scenario) freeze(c *child) (sent, stopped time.Time) {
	s.T.Helper()
	sent = time.Now()
	require.NoError(s.T, c.cmd.Process.Signal(syscall.SIGSTOP))
	s.WaitFor("runner "+c.node+" to be stopped", func() bool { return procState(c.cmd.Process.Pid) == "T" })
	return sent, time.Now()
}

// thaw resumes the child with SIGCONT and returns the moment it was sent:
// nothing of the child ran before it since the freeze.
func (s *scenario) thaw(c *child) time.Time {
	s.T.Helper()
	require.NoError(s.T, c.cmd.Process.Signal(syscall.SIGCONT))
	return time.Now()
}

// procState is the state letter of /proc/<pid>/stat ("T": stopped).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) state ...: comm may hold spaces, so read after its ")".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}
