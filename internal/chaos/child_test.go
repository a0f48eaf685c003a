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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

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
)

// appPrefix starts the application_name of every runner process's
// connections ("arbor-chaos-" + node): what test (b) terminates by, and
// what the audit trigger records as the writer of each row version.
const appPrefix = "arbor-chaos-"

// Runner settings of every runner process: a short conversation lease (a
// killed or frozen runner's conversations are taken over a second later)
// and short polls.
const (
	leaseDefault = time.Second
	pollInterval = 50 * time.Millisecond
	workers      = 32
	poolConns    = 16
	taskLease    = 5 * time.Second
	// idleInTx is below the lease, as tasks.Config.IdleInTransaction asks:
	// a frozen runner's open transactions end within it, so that they do
	// not keep its conversations from the take-over.
	idleInTx  = 500 * time.Millisecond
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
	cfg, err := pgxpool.ParseConfig(os.Getenv(testdb.EnvURL))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.MaxConns = poolConns
	cfg.ConnConfig.RuntimeParams["application_name"] = appPrefix + node
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema, TaskLease: taskLease, RestartLimit: restartSafe,
		IdleInTransaction: idleInTx, Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w := &worker{pool: pool, schema: schema, node: node, engine: engine}
	runner, err := machine.NewRunner(engine, w.handlers(), &machine.RunnerConfig{
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
	t := s.t
	t.Helper()
	c := &child{node: node, log: filepath.Join(s.logDir, node+".log"), done: make(chan struct{})}
	logFile, err := os.Create(c.log)
	require.NoError(t, err)
	defer logFile.Close() // the child has its own descriptor
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), envChild+"=1", envSchema+"="+s.schema, envNode+"="+node, envLease+"="+lease.String())
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
	select {
	case <-out.started:
	case <-c.done:
		require.FailNow(t, "runner process did not start", "%s: %v; its log:\n%s", node, c.err, tail(c.log, 40))
	case <-time.After(time.Minute):
		require.FailNow(t, "runner process did not start within a minute", "%s; its log:\n%s", node, tail(c.log, 40))
	}
	return c
}

// kill kills the child with SIGKILL, waits for it to be gone and records
// the moment (database clock) in chaos_nodes: no run of it lasts beyond.
func (s *scenario) kill(c *child) {
	s.t.Helper()
	require.NoError(s.t, c.cmd.Process.Signal(syscall.SIGKILL))
	<-c.done
	s.exec(`INSERT INTO {s}.chaos_nodes (node, died_at) VALUES ($1, clock_timestamp())`, c.node)
}

// stop asks the child to shut down gracefully and requires a clean exit:
// its runner stopped with every handler returned and every lease released.
func (s *scenario) stop(c *child) {
	s.t.Helper()
	require.NoError(s.t, c.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		require.FailNow(s.t, "runner process did not stop within a minute", "%s; its log:\n%s", c.node, tail(c.log, 40))
	}
	require.NoError(s.t, c.err, "runner %s stops cleanly; its log:\n%s", c.node, tail(c.log, 40))
}

// freeze stops the child with SIGSTOP and waits until the kernel says it
// is stopped.
func (s *scenario) freeze(c *child) {
	s.t.Helper()
	require.NoError(s.t, c.cmd.Process.Signal(syscall.SIGSTOP))
	s.waitFor("runner "+c.node+" to be stopped", func() bool { return procState(c.cmd.Process.Pid) == "T" })
}

func (s *scenario) thaw(c *child) {
	s.t.Helper()
	require.NoError(s.t, c.cmd.Process.Signal(syscall.SIGCONT))
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

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logSummary counts the messages of the runner processes' logs at WARN
// and above, for the test's figures.
func (s *scenario) logSummary(t *testing.T) {
	counts := map[string]int{}
	for _, c := range s.children {
		b, err := os.ReadFile(c.log)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, `"level":"WARN"`) && !strings.Contains(line, `"level":"ERROR"`) {
				continue
			}
			msg := line
			if i := strings.Index(line, `"msg":"`); i >= 0 {
				msg = line[i+7:]
				if j := strings.Index(msg, `"`); j >= 0 {
					msg = msg[:j]
				}
			}
			counts[msg]++
		}
	}
	for msg, n := range counts {
		t.Logf("runner log: %5d × %s", n, msg)
	}
}
