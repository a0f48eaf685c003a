package machine

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLifeLock: a life's file is locked while its process holds it open, so
// no other lock of the same database proves it dead; once its descriptor
// is closed without a release (what a death does), a prover of the same
// database gets the lock and reads the life back, a prover of another
// database never sees it, and a proven file is removed. A new life removes
// the previous one's file; a release removes its own; a file of the right
// name that is no life of this database is removed.
func TestLifeLock(t *testing.T) {
	dir := t.TempDir()
	mk := func(db string) *lifeLock {
		l, err := newLifeLock(dir, db)
		require.NoError(t, err)
		return l
	}
	a, prover, other := mk("sys/db/arbor"), mk("sys/db/arbor"), mk("sys/db/other")
	born := time.Date(2026, 12, 6, 8, 0, 0, 123456000, time.UTC)
	require.NoError(t, a.hold(lifeRecord{HolderID: 7, Name: "node-a", Created: born}))
	files := func() []string {
		es, err := os.ReadDir(dir)
		require.NoError(t, err)
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	require.Len(t, files(), 1, "the final name only")
	require.Empty(t, prover.dead(), "a live life's file is locked")
	require.Empty(t, other.dead())

	// A new life: the previous file goes.
	require.NoError(t, a.hold(lifeRecord{HolderID: 8, Name: "node-a", Created: born}))
	require.Len(t, files(), 1)
	require.Empty(t, prover.dead())

	// The process dies: its descriptor closes, the file stays.
	a.mu.Lock()
	require.NoError(t, a.own.Close())
	a.own = nil
	a.mu.Unlock()
	require.Empty(t, other.dead(), "another database's prover never sees it")
	got := prover.dead()
	require.Len(t, got, 1)
	require.Equal(t, int64(8), got[0].rec.HolderID)
	require.Equal(t, "node-a", got[0].rec.Name)
	require.True(t, born.Equal(got[0].rec.Created))
	require.Equal(t, os.Getpid(), got[0].rec.PID)
	require.Empty(t, mk("sys/db/arbor").dead(), "locked by the prover meanwhile")
	got[0].done(true)
	require.Empty(t, files())

	// A prover's own file is never its proof; a release removes it.
	require.NoError(t, prover.hold(lifeRecord{HolderID: 9, Name: "node-b", Created: born}))
	require.Empty(t, prover.dead())
	prover.release()
	require.Empty(t, files())

	// Garbage under a life's name: removed.
	junk := filepath.Join(dir, prover.prefix+"10"+lifeSuffix)
	require.NoError(t, os.WriteFile(junk, []byte("not json"), 0o600))
	require.Empty(t, prover.dead())
	require.Empty(t, files())
}
