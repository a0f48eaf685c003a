package bench

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// The rounds' order and the medians are pure functions: these tests need
// no database.

func TestRoundOrderIsAPermutationThatRotatesTheFirst(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 7; n++ {
		firsts := map[int]int{}
		for r := range 3 * n {
			order := roundOrder(n, r)
			sorted := slices.Sorted(slices.Values(order))
			for i := range n {
				require.Equal(t, i, sorted[i], "n=%d round %d: %v is not a permutation", n, r, order)
			}
			require.Equal(t, r%n, order[0], "n=%d round %d: subject r mod n leads", n, r)
			require.Equal(t, order, roundOrder(n, r), "n=%d round %d: the same order again", n, r)
			firsts[order[0]]++
		}
		for i := range n {
			require.Equal(t, 3, firsts[i], "n=%d: subject %d leads one round in n", n, i)
		}
	}
	require.Empty(t, roundOrder(0, 3))
}

// Beyond the first, the order is shuffled: over rounds, a subject does not
// always follow the same one, and it is not a mere rotation.
func TestRoundOrderVariesWhatFollowsWhat(t *testing.T) {
	t.Parallel()
	const n = 6
	follows := map[[2]int]bool{}
	rotation := true
	for r := range 10 {
		order := roundOrder(n, r)
		for i := 1; i < n; i++ {
			follows[[2]int{order[i-1], order[i]}] = true
			rotation = rotation && order[i] == (order[i-1]+1)%n
		}
	}
	require.False(t, rotation, "the order after the first is shuffled, not rotated")
	require.Greater(t, len(follows), n, "pairs (a directly before b) seen over 10 rounds: more than a fixed cycle's %d", n)
	// Two subjects (River against the runner, DBOS against the runner)
	// simply alternate.
	require.Equal(t, []int{0, 1}, roundOrder(2, 0))
	require.Equal(t, []int{1, 0}, roundOrder(2, 1))
	require.Equal(t, []int{0, 1}, roundOrder(2, 4))
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		in   []float64
		want float64
	}{
		"none":     {nil, 0},
		"one":      {[]float64{0.4}, 0.4},
		"odd":      {[]float64{5, 1, 3}, 3},
		"even":     {[]float64{4, 1, 3, 2}, 2.5},
		"repeated": {[]float64{2, 2, 9, 2, 1}, 2},
		"outlier":  {[]float64{0.42, 0.38, 0.47, 0.40, 9}, 0.42},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := slices.Clone(tc.in)
			require.InDelta(t, tc.want, median(tc.in), 1e-12)
			require.Equal(t, in, tc.in, "median leaves its input as it was")
		})
	}
}

func TestSpreadOf(t *testing.T) {
	t.Parallel()
	s := spreadOf([]int{1, 2, 3, 4, 5}, []float64{0.42, 0.38, 0.47, 0.40, 0.45})
	require.InDelta(t, 0.42, s.Median, 1e-12)
	require.InDelta(t, 0.38, s.Min, 1e-12)
	require.InDelta(t, 0.47, s.Max, 1e-12)
	require.Equal(t, []int{1, 2, 3, 4, 5}, s.Rounds)
	require.Equal(t, "0.42× (0.38–0.47)", spreadText(s))

	require.Equal(t, Spread{}, spreadOf(nil, nil))
	one := spreadOf([]int{1}, []float64{0.031})
	require.Equal(t, "0.03×", spreadText(one), "one round has no range")
	require.Equal(t, "12× (8.51–15)", spreadText(spreadOf([]int{1, 2, 3}, []float64{12.4, 8.51, 15.2})))
}

// rounds builds a subject's rounds with these tasks/s, numbered from first.
func rounds(first int, tasksPerSec ...float64) []RoundResult {
	out := make([]RoundResult, len(tasksPerSec))
	for i, v := range tasksPerSec {
		out[i] = RoundResult{Round: first + i, Figures: Figures{TasksPerSec: v}}
	}
	return out
}

// A ratio divides the two sides of the same round, never the best of one
// by the best of the other nor the median by the median.
func TestRatioSpreadPairsTheSameRound(t *testing.T) {
	t.Parallel()
	runner := rounds(1, 100, 200, 300, 400, 500)
	river := rounds(1, 200, 250, 1000, 500, 1000)
	s, ok := ratioSpread(runner, river)
	require.True(t, ok)
	require.Equal(t, []int{1, 2, 3, 4, 5}, s.Rounds)
	require.InDeltaSlice(t, []float64{0.5, 0.8, 0.3, 0.8, 0.5}, s.Values, 1e-12)
	require.InDelta(t, 0.5, s.Median, 1e-12)
	require.InDelta(t, 0.3, s.Min, 1e-12)
	require.InDelta(t, 0.8, s.Max, 1e-12)
	// median(runner) ÷ median(river) would be 300 ÷ 500 = 0.6.

	// A subject capped at one round is compared in that round only.
	capped := rounds(1, 50)
	s, ok = ratioSpread(capped, river)
	require.True(t, ok)
	require.Equal(t, []int{1}, s.Rounds)
	require.InDelta(t, 0.25, s.Median, 1e-12)

	// Rounds without a figure on both sides give no ratio.
	_, ok = ratioSpread(rounds(6, 10, 20), river)
	require.False(t, ok)
	_, ok = ratioSpread(runner, nil)
	require.False(t, ok)
	withGap := append(rounds(1, 100), rounds(3, 300)...)
	s, ok = ratioSpread(withGap, river)
	require.True(t, ok)
	require.Equal(t, []int{1, 3}, s.Rounds)
	require.InDelta(t, 0.4, s.Median, 1e-12, "the mean of the two middle ratios, 0.5 and 0.3")
}

func TestMedianFiguresAndRound(t *testing.T) {
	t.Parallel()
	rs := []RoundResult{
		{Round: 1, Figures: Figures{TasksPerSec: 300, ClientCPUMicrosPerTask: 30, ServerCPUMicrosPerTask: 90, CommitsPerTask: 0.02}},
		{Round: 2, Figures: Figures{TasksPerSec: 100, ClientCPUMicrosPerTask: 50, ServerCPUMicrosPerTask: 70, CommitsPerTask: 0.03}},
		{Round: 3, Figures: Figures{TasksPerSec: 200, ClientCPUMicrosPerTask: 40, ServerCPUMicrosPerTask: 80, CommitsPerTask: 0.01}},
	}
	f := medianFigures(rs)
	require.InDelta(t, 200, f.TasksPerSec, 1e-12)
	require.InDelta(t, 40, f.ClientCPUMicrosPerTask, 1e-12)
	require.InDelta(t, 80, f.ServerCPUMicrosPerTask, 1e-12)
	require.InDelta(t, 0.02, f.CommitsPerTask, 1e-12)
	byTasks := func(f Figures) float64 { return f.TasksPerSec }
	require.Equal(t, 2, medianRound(rs, byTasks), "round 3 has the median tasks/s")
	require.Equal(t, 1, medianRound(rs[:2], byTasks), "of two, the lower: a round that was measured")
	require.Equal(t, -1, medianRound(nil, byTasks))

	// A round that could not count the server's CPU or the commits makes
	// the median unknown, not a median of the others.
	rs[1].ServerCPUMicrosPerTask, rs[2].CommitsPerTask = -1, -1
	f = medianFigures(rs)
	require.InDelta(t, -1, f.ServerCPUMicrosPerTask, 0)
	require.InDelta(t, -1, f.CommitsPerTask, 0)
	require.InDelta(t, 40, f.ClientCPUMicrosPerTask, 1e-12)
}
