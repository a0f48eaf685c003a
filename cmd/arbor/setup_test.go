package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
	"github.com/arborhq/arbor/internal/enginetest"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

// The tests run the arbor binary itself, built once by TestMain, as a
// subprocess against the real PostgreSQL: what they check is what an
// operator sees, exit status included.
var arborBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "arbor-cli-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		os.Exit(2)
	}
	arborBin = filepath.Join(dir, "arbor")
	build := exec.Command("go", "build", "-o", arborBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build arbor:", err)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := testdb.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	schema string
	engine *enginetest.Engine
	conv   string
}

// setup gives the test a migrated schema of its own (so that ls and check
// without a conversation see only the test's rows, and ids start at 1), an
// engine on it and a conversation id.
func setup(t *testing.T) *bundle {
	t.Helper()
	pool, schema := testdb.Fresh(t)
	ctx := context.Background()
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: schema})
	require.NoError(t, err)
	return &bundle{ctx: ctx, pool: pool, schema: schema, engine: enginetest.Wrap(engine), conv: testdb.Conversation(t)}
}

// result is what one run of the binary did.
type result struct {
	stdout, stderr string
	code           int
}

// arbor runs the binary with args and the bundle's database and schema
// given as flags, after the arguments, as an operator would add them.
func (b *bundle) arbor(t *testing.T, args ...string) result {
	t.Helper()
	return runArbor(t, nil, append(args, "--database-url", testdb.URL(t), "--schema", b.schema)...)
}

// runArbor runs the binary with exactly args. ARBOR_DATABASE_URL is removed
// from its environment, then env (KEY=value) is added.
func runArbor(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, arborBin, args...)
	cmd.Env = append(environWithout("ARBOR_DATABASE_URL"), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run arbor %v: %v", args, err)
	}
	return res
}

func environWithout(name string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// ok requires that the run succeeded with nothing on stderr.
func (r result) ok(t *testing.T) result {
	t.Helper()
	require.Equal(t, 0, r.code, "exit status; stderr:\n%s", r.stderr)
	require.Empty(t, r.stderr)
	return r
}

// fails requires exit status code and exactly one line on stderr that
// contains want.
func (r result) fails(t *testing.T, code int, want string) {
	t.Helper()
	require.Equal(t, code, r.code, "exit status; stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "want one line on stderr, got:\n%s", r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "arbor: "), r.stderr)
	require.Contains(t, r.stderr, want)
}

func (b *bundle) create(t *testing.T, owner int64, kind string, background bool) arbortype.Task {
	t.Helper()
	task, created, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, OwnerID: owner, Kind: kind,
		Background: background, Input: json.RawMessage(fmt.Sprintf(`{"kind": %q}`, kind))})
	require.NoError(t, err)
	require.True(t, created)
	return task
}

func (b *bundle) start(t *testing.T, id int64) arbortype.Task {
	t.Helper()
	task, err := b.engine.Start(b.ctx, id)
	require.NoError(t, err)
	return task
}

func (b *bundle) get(t *testing.T, id int64) arbortype.Task {
	t.Helper()
	task, err := b.engine.Get(b.ctx, id)
	require.NoError(t, err)
	return task
}

// requireInvariants runs the invariant checker over the whole schema.
func (b *bundle) requireInvariants(t *testing.T) {
	t.Helper()
	vs, err := b.engine.Check(b.ctx)
	require.NoError(t, err)
	require.Empty(t, vs)
}

// corrupt runs a raw UPDATE on the tasks table with the guard trigger off,
// as a buggy tool or a hand-written fix would: the database state it leaves
// is one no arbor operation can make.
func (b *bundle) corrupt(t *testing.T, sql string, args ...any) {
	t.Helper()
	tbl := pgx.Identifier{b.schema, "tasks"}.Sanitize()
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `ALTER TABLE `+tbl+` DISABLE TRIGGER task_guard; ALTER TABLE `+tbl+` DISABLE TRIGGER "Arbor_task_guard_update"`); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, strings.ReplaceAll(sql, "{tasks}", tbl), args...); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `ALTER TABLE `+tbl+` ENABLE TRIGGER task_guard; ALTER TABLE `+tbl+` ENABLE TRIGGER "Arbor_task_guard_update"`)
		return err
	})
	require.NoError(t, err)
}

// sampleTree builds, through the engine, a conversation with every kind of
// line the tree draws: a waiting root with a completed, a failed, a pending
// and a running background child, and a second root whose sub-agent
// completed while its own child is still pending (completing).
//
//	#1 chat_turn waiting on #2 #3 #4     #6 chat_turn running
//	   #2 completed, #3 failed,            #7 sub_agent completing
//	   #4 pending, #5 background running      #8 browse pending
func (b *bundle) sampleTree(t *testing.T) {
	t.Helper()
	turn := b.start(t, b.create(t, 0, "chat_turn", false).ID)
	search := b.create(t, turn.ID, "search_web", false)
	docs := b.create(t, turn.ID, "read_docs", false)
	approval := b.create(t, turn.ID, "ask_approval", false)
	summary := b.create(t, turn.ID, "summarize_history", true)
	require.Equal(t, []int64{1, 2, 3, 4, 5}, []int64{turn.ID, search.ID, docs.ID, approval.ID, summary.ID})

	s := b.start(t, search.ID)
	_, err := b.engine.Complete(b.ctx, s.ID, s.Token, json.RawMessage(`{"hits": 3}`))
	require.NoError(t, err)
	d := b.start(t, docs.ID)
	_, err = b.engine.Fail(b.ctx, d.ID, d.Token, arbortype.TaskError{Message: "docs server returned 503"})
	require.NoError(t, err)
	b.start(t, summary.ID)
	w, err := b.engine.WaitForChildren(b.ctx, turn.ID, turn.Token, core.WaitParams{
		ChildIDs: []int64{search.ID, docs.ID, approval.ID}, Policy: arbortype.AllSettled,
		Phase: "gathering", State: json.RawMessage(`{"waiting_for": 3}`)})
	require.NoError(t, err)
	require.False(t, w.Woken)

	turn2 := b.start(t, b.create(t, 0, "chat_turn", false).ID)
	agent := b.start(t, b.create(t, turn2.ID, "sub_agent", false).ID)
	browse := b.create(t, agent.ID, "browse", false)
	require.Equal(t, int64(8), browse.ID)
	_, err = b.engine.Complete(b.ctx, agent.ID, agent.Token, json.RawMessage(`{"answer": 42}`))
	require.NoError(t, err)
}
