package arbortest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortest"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/tasks"
)

type bundle struct {
	ctx    context.Context
	engine *tasks.Engine
	conv   string
}

// setup gives a test an engine on a schema of its own and a conversation.
func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testdb.NewPool(t)
	return &bundle{ctx: t.Context(), engine: arbortest.Engine(t, pool, nil), conv: testdb.Conversation(t)}
}

// create makes a root task of kind in the bundle's conversation.
func (b *bundle) create(t *testing.T, p arbortype.CreateParams) int64 {
	t.Helper()
	if p.ConversationID == "" {
		p.ConversationID = b.conv
	}
	task, _, err := b.engine.Create(b.ctx, p)
	require.NoError(t, err)
	return task.ID
}

// fakeTB records the failures a helper reports instead of failing the
// test; everything else is the real test's.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) { f.record(format, args...) }

func (f *fakeTB) Errorf(format string, args ...any) { f.record(format, args...) }

func (f *fakeTB) Fatal(args ...any) { f.record("%s", fmt.Sprint(args...)) }

func (f *fakeTB) Error(args ...any) { f.record("%s", fmt.Sprint(args...)) }

func (f *fakeTB) FailNow() { f.record("FailNow") }

func (f *fakeTB) Fail() { f.record("Fail") }

func (f *fakeTB) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, fmt.Sprintf(format, args...))
}

// requireFailed requires that the helper reported exactly one failure, and
// that it says every one of parts.
func (f *fakeTB) requireFailed(t *testing.T, parts ...string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.failed, 1, "the helper reports one failure: %q", f.failed)
	t.Logf("reported: %s", f.failed[0])
	for _, p := range parts {
		require.Contains(t, f.failed[0], p)
	}
	f.failed = nil
}

func (f *fakeTB) requirePassed(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Empty(t, f.failed, "the helper reports no failure: %s", strings.Join(f.failed, "; "))
}

func testdbPool(t *testing.T) *pgxpool.Pool { return testdb.NewPool(t) }
