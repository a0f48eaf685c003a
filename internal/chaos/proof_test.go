package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/enginetest"
)

// TestProofCatchesViolations checks the checks: the end-of-scenario queries
// find a write that landed with a dead token, and two runs of a task whose
// lives overlap, when the test makes them by hand (no runner involved).
func TestProofCatchesViolations(t *testing.T) {
	s := setup(t, 1)
	e := enginetest.Wrap(s.engine)
	first, err := e.Start(s.ctx, s.turns[0])
	require.NoError(t, err)
	_, err = e.Recover(s.ctx, s.turns[0]) // the first run's token dies
	require.NoError(t, err)
	second, err := e.Start(s.ctx, s.turns[0])
	require.NoError(t, err)

	// A write stamped by the first run lands behind the engine's back.
	s.exec(fmt.Sprintf(`UPDATE {s}.tasks SET state = '{"by": {"token": %d, "node": "x"}}' WHERE id = $1`, first.Token), s.turns[0])
	stale := s.rows(staleWriteQueries[0].sql)
	require.Len(t, stale, 1, "the stale write is found")
	require.Contains(t, stale[0], fmt.Sprintf("old_token=%d", second.Token))
	require.Contains(t, stale[0], fmt.Sprintf("by_token=%d", first.Token))
	// The run's own write is not.
	s.exec(fmt.Sprintf(`UPDATE {s}.tasks SET state = '{"by": {"token": %d, "node": "x"}}' WHERE id = $1`, second.Token), s.turns[0])
	require.Len(t, s.rows(staleWriteQueries[0].sql), 1, "a write of the current run is no stale write")

	// Two calls of one task (tokens the audit never saw, so their lives
	// end with their calls): 1 and 2 overlap, 3 starts as 2 ends.
	at := time.Now()
	for i, r := range []struct{ start, end time.Duration }{{0, 2 * time.Second}, {time.Second, 3 * time.Second}, {3 * time.Second, 4 * time.Second}} {
		s.exec(`INSERT INTO {s}.run_log (id, task_id, token, node, kind, attempt, started_at, ended_at)
			VALUES ($1, -1, $2, 'x', 'k', 0, $3, $4)`, int64(i+1), int64(-i-1), at.Add(r.start), at.Add(r.end))
	}
	overlaps := s.rows(overlapSQL)
	require.Len(t, overlaps, 1, strings.Join(overlaps, "\n"))
	require.Contains(t, overlaps[0], "run=1 ")
	require.Contains(t, overlaps[0], "other=2 ")
}
