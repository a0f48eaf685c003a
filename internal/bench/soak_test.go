package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/bench"
	"github.com/arborhq/arbor/internal/testdb"
)

// TestSoakShort runs the soak for a few seconds with the harness's own
// prune loop (a second's retention: the periodic job's least is a minute).
// It asserts what the soak did and what its report holds — turns created
// and completed, history pruned, every table sampled every interval, a
// verdict with every check, the end clean — and not the verdict itself:
// whether a few seconds on a busy machine are flat (autovacuum has not come
// round yet) is not what this test is about.
func TestSoakShort(t *testing.T) {
	t.Parallel()
	// A soak of a few seconds on a starved machine may have no turn old
	// enough for the prune when it looks (its turns complete late): such a
	// run says nothing about the prune, and is run again with every
	// interval twice as long — the same five intervals after a warm-up of
	// two, the prune's age unchanged — up to four times (1 s to 8 s an
	// interval). Run again at the same length, it failed five times in a
	// row beside a second make test and a failover suite, with turns
	// taking 3.3 s at p99.
	var out bytes.Buffer
	var rep *bench.SoakReport
	interval := time.Second
	for attempt := 1; ; attempt++ {
		out.Reset()
		rep = soakShort(t, &out, interval)
		if prunedTurns(rep) > 0 || attempt == 4 {
			break
		}
		t.Logf("run %d (%s an interval): no turn was old enough for the prune in time; again, with intervals twice as long. Its report:\n%s",
			attempt, interval, out.String())
		interval *= 2
	}

	require.Len(t, rep.Samples, 6, "the baseline and one sample per interval")
	var created, completed int
	for i, s := range rep.Samples {
		require.Equal(t, i, s.Index)
		require.Len(t, s.Tables, 7)
		for _, tb := range s.Tables {
			require.NotEmpty(t, tb.Name)
			require.Positive(t, tb.TotalBytes, "%s at %d", tb.Name, i)
			require.GreaterOrEqual(t, tb.TotalBytes, tb.IndexBytes, tb.Name)
		}
		created += s.Created
		completed += s.Completed
		if s.Completed > 0 {
			require.Positive(t, s.P50)
			require.GreaterOrEqual(t, s.P99, s.P50)
			require.GreaterOrEqual(t, s.Max, s.P99)
		}
	}
	require.Zero(t, rep.Samples[0].Tables[0].Rows, "no task before the producer starts")
	require.Positive(t, created)
	// Every turn created completed: the turns in flight at the end (some
	// created after the last sample, before the producer stopped) were
	// waited for, and none timed out.
	require.LessOrEqual(t, created, rep.End.TurnsCreated)
	require.LessOrEqual(t, completed, rep.End.TurnsCompleted)
	require.Equal(t, rep.End.TurnsCreated, rep.End.TurnsCompleted)
	require.Positive(t, prunedTurns(rep), "the prune loop deleted turns")
	require.Zero(t, rep.End.Timeouts)
	require.Zero(t, rep.End.HarnessErrors, rep.End.FirstHarnessError)
	require.Zero(t, rep.End.PruneErrors)
	require.Zero(t, rep.End.Errors, rep.End.FirstLogError)
	require.Zero(t, rep.End.TasksNotCompleted)
	require.Zero(t, rep.End.Violations, rep.End.FirstViolation)
	require.Positive(t, rep.Steady.Turns)
	require.Positive(t, rep.Steady.StatementsPerTurn)

	require.Equal(t, 4, rep.Verdict.First, "half-way between the first interval after a warm-up of two (3) and the last (5)")
	require.Equal(t, 5, rep.Verdict.Last)
	require.Len(t, rep.Verdict.Checks, 7*4+2+6)
	flat := true
	for _, c := range rep.Verdict.Checks {
		flat = flat && c.OK
	}
	require.Equal(t, flat, rep.Flat)
	require.Contains(t, out.String(), fmt.Sprintf("interval 5 (%s–%s)", 4*interval, 5*interval))
	require.Contains(t, out.String(), "budget_reservations")
	require.Contains(t, out.String(), "verdict: ")

	path := filepath.Join(t.TempDir(), "soak.json")
	require.NoError(t, rep.WriteJSON(path))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var back bench.SoakReport
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, rep.Samples[3].Tables[0].TotalBytes, back.Samples[3].Tables[0].TotalBytes)

	// The soak dropped its schema.
	require.NotEmpty(t, rep.Schema)
	pool := testdb.NewPool(t)
	var left int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname = $1`, rep.Schema).Scan(&left))
	require.Zero(t, left, "schema left behind")
}

func TestSoakOptionsRefused(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		o    bench.SoakOptions
		want string
	}{
		"no url":          {bench.SoakOptions{}, "DatabaseURL"},
		"too short":       {bench.SoakOptions{DatabaseURL: "postgres://x", Duration: time.Minute}, "fewer than two intervals"},
		"short retention": {bench.SoakOptions{DatabaseURL: "postgres://x", Retention: time.Second}, "Retention"},
		"bad rate":        {bench.SoakOptions{DatabaseURL: "postgres://x", Rate: -1}, "Rate"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := bench.Soak(context.Background(), tc.o)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// soakShort runs TestSoakShort's soak, five intervals of interval after
// a warm-up of two, its report printed to out.
func soakShort(t *testing.T, out *bytes.Buffer, interval time.Duration) *bench.SoakReport {
	rep, err := bench.Soak(context.Background(), bench.SoakOptions{
		DatabaseURL:    testdb.URL(t),
		Duration:       5 * interval,
		Interval:       interval,
		Warmup:         2 * interval,
		Rate:           10,
		PruneOlderThan: 500 * time.Millisecond,
		PruneInterval:  300 * time.Millisecond,
		ThinkTime:      200 * time.Millisecond,
		Conns:          4,
		Out:            out,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	return rep
}

// prunedTurns is the turns the soak's prune deleted, over its samples.
func prunedTurns(rep *bench.SoakReport) int64 {
	var n int64
	for _, s := range rep.Samples {
		n += s.PrunedTurns
	}
	return n
}
