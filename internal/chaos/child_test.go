package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

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
	<-ctx.Done()
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	if err := runner.Stop(stopCtx); err != nil {
		fmt.Fprintln(os.Stderr, "stop:", err)
		return 1
	}
	return 0
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
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   string // its stderr
	done  chan struct{}
	err   error // Wait's, once done is closed
}

// startedWriter watches a child's stdout for its "runner started" line.
type startedWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	started chan struct{}
	once    sync.Once
}

func (w *startedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), "runner started") {
		w.once.Do(func() { close(w.started) })
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
	c.cmd.Stderr = logFile
	out := &startedWriter{started: make(chan struct{})}
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
