package machine_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/testdb"
	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/tasks"
)

// cutStatements is a pool's tracer that keeps the SQLSTATEs of its failed
// statements: the signal that the server cut one.
type cutStatements struct {
	mu    sync.Mutex
	codes map[string]int
}

func (c *cutStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *cutStatements) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	var pgErr *pgconn.PgError
	if errors.As(data.Err, &pgErr) {
		c.mu.Lock()
		if c.codes == nil {
			c.codes = map[string]int{}
		}
		c.codes[pgErr.Code]++
		c.mu.Unlock()
	}
}

func (c *cutStatements) count(code string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.codes[code]
}

// timeoutRole is an engine whose pool logs in as a role with a server-side
// limit set at role level (setting = 200ms), as many production databases
// set statement_timeout, and what it needs to hold a conversation's row
// past that limit.
type timeoutRole struct {
	b       *bundle
	role    string
	setting string
	code    string
	eng     *tasks.Engine
	cut     *cutStatements
}

func newTimeoutRole(t *testing.T, b *bundle, setting, code string) *timeoutRole {
	t.Helper()
	cfg := testdb.RoleWith(t, b.pool, map[string]string{setting: "200ms"})
	cut := &cutStatements{}
	cfg.ConnConfig.Tracer = cut
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var value string
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT current_setting('`+setting+`')`).Scan(&value))
	require.Equal(t, "200ms", value, "the role's own setting is in force on its sessions")
	eng, err := tasks.New(b.ctx, pool, &tasks.Config{Schema: b.schema})
	require.NoError(t, err)
	return &timeoutRole{b: b, role: cfg.ConnConfig.User, setting: setting, code: code, eng: eng, cut: cut}
}

// hold locks conversation's row in a transaction of another session, as
// an application's transaction (a CreateTx, an EmitTx) holds it; release
// commits it.
func (r *timeoutRole) hold(t *testing.T, conversation string) (release func()) {
	t.Helper()
	tx, err := r.b.pool.Begin(r.b.ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(r.b.ctx, `SELECT 1 FROM `+r.b.schema+`.conversations WHERE id = $1 FOR NO KEY UPDATE`, conversation)
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Commit(r.b.ctx)) }
}

// pastTheLimit waits, while the row is held, until the role's limit has had
// its chance at the call (done): the server cut one more of the role's
// statements than cutBefore, or one it does not cut has waited for the
// lock three times the limit. The call must not return meanwhile.
func (r *timeoutRole) pastTheLimit(t *testing.T, what string, done <-chan error, cutBefore int) {
	t.Helper()
	waitUntil(t, what+" to outlast the role's "+r.setting, func() bool {
		select {
		case err := <-done:
			require.Failf(t, what+" returned while the conversation's row was held", "error: %v", err)
		default:
		}
		return r.cut.count(r.code) > cutBefore || r.b.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE usename = $1 AND wait_event_type = 'Lock' AND now() - query_start > interval '600 ms'`, r.role) > 0
	})
}

// A server-side timeout of the role arbor runs as — statement_timeout
// (57014) or lock_timeout (55P03) set at role level — cuts arbor's
// statements while an application transaction holds a conversation's row
// past it (issue 38: a Progress cut with 57014 reached the handler as
// ErrDatabase and the task failed; Abort failed the same way). Such a cut is
// a transient fault: Progress, Complete and Abort neither fail nor fail
// their task, and land once the row is free.
func TestServerTimeoutsOfTheRoleDoNotFailWrites(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ setting, code string }{
		{"statement_timeout", "57014"},
		{"lock_timeout", "55P03"},
	} {
		t.Run(c.setting, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := newTimeoutRole(t, b, c.setting, c.code)
			turn, _, err := r.eng.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn"})
			require.NoError(t, err)
			lease, err := machine.AcquireLease(b.ctx, r.eng, b.conv, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			run, err := lease.Start(b.ctx, turn.ID)
			require.NoError(t, err)

			// Progress: one statement, which keeps the role's limit: cut,
			// and tried again until the row is free.
			release := r.hold(t, b.conv)
			done := make(chan error, 1)
			before := r.cut.count(c.code)
			go func() { done <- run.Progress(b.ctx, "token", json.RawMessage(`"held"`)) }()
			r.pastTheLimit(t, "the progress entry", done, before)
			require.Greater(t, r.cut.count(c.code), before, "the server cut the one-statement progress entry (%s)", c.code)
			release()
			require.NoError(t, <-done, "a progress entry cut by the server's %s", c.setting)
			entries, err := r.eng.ReadLog(b.ctx, b.conv, 0, 100)
			require.NoError(t, err)
			var payloads []string
			for _, e := range entries {
				if e.Kind == arbortype.LogKindProgress {
					payloads = append(payloads, string(e.Payload))
				}
			}
			require.Equal(t, []string{`"held"`}, payloads, "the entry landed, once")
			require.Equal(t, arbortype.StatusRunning, b.get(t, turn.ID).Status)

			// Complete: the run's ending, a transaction of arbor's.
			release = r.hold(t, b.conv)
			before = r.cut.count(c.code)
			go func() { done <- run.Complete(b.ctx, json.RawMessage(`{"ok": true}`)) }()
			r.pastTheLimit(t, "the complete", done, before)
			release()
			require.NoError(t, <-done, "a complete past the server's %s", c.setting)
			got := b.get(t, turn.ID)
			require.Equal(t, arbortype.StatusCompleted, got.Status)
			require.JSONEq(t, `{"ok": true}`, string(got.Result))
			require.NoError(t, lease.Release(b.ctx))

			// Abort, from the application (a pool form).
			other := b.conv + "-abort"
			victim, _, err := r.eng.Create(b.ctx, arbortype.CreateParams{ConversationID: other, Kind: "turn"})
			require.NoError(t, err)
			release = r.hold(t, other)
			before = r.cut.count(c.code)
			go func() {
				_, err := r.eng.Abort(b.ctx, victim.ID)
				done <- err
			}()
			r.pastTheLimit(t, "the abort", done, before)
			release()
			require.NoError(t, <-done, "an abort past the server's %s", c.setting)
			require.Equal(t, arbortype.StatusOrphaned, b.get(t, victim.ID).Status, "aborted before it ran")
			b.requireClean(t, other)
		})
	}
}
