package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// The subjects of a scenario at one size run in rounds: in each round every
// subject runs once, in an order that changes from round to round, and a
// ratio is computed per round from the two subjects' runs of that round, so
// that a slow spell of the shared machine falls on both sides of it. The
// table shows the median of those per-round ratios and their range: the
// median is what a reader compares across runs, the range says how far one
// round can stray from it.

// roundOrder returns the order in which n subjects run in round r (from
// 0), as indexes into the scenario's subjects. Subject r mod n goes first,
// so that each subject leads one round in n and none is always first; the
// others follow in an order shuffled by a generator seeded with the round
// and n, so that no subject always runs right after the same one either.
// The order is a function of n and r alone: a rerun runs the same rounds
// in the same orders.
func roundOrder(n, r int) []int {
	if n <= 0 {
		return nil
	}
	first := r % n
	order := make([]int, 0, n)
	order = append(order, first)
	for i := range n {
		if i != first {
			order = append(order, i)
		}
	}
	rest := order[1:]
	rng := rand.New(rand.NewPCG(uint64(r), uint64(n)))
	rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	return order
}

// Spread is one figure over the rounds it was measured in: its median,
// its range, and its value in each round.
type Spread struct {
	// Median is the middle value, or the mean of the two middle values
	// when the rounds are even in number.
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Rounds numbers the rounds (from 1) the values come from, and Values
	// holds the figure of each, in the same order.
	Rounds []int     `json:"rounds"`
	Values []float64 `json:"values"`
}

// spreadOf returns the Spread of values, measured in rounds (same length).
// The zero Spread is returned for no values.
func spreadOf(rounds []int, values []float64) Spread {
	if len(values) == 0 {
		return Spread{}
	}
	return Spread{
		Median: median(values),
		Min:    slices.Min(values),
		Max:    slices.Max(values),
		Rounds: slices.Clone(rounds),
		Values: slices.Clone(values),
	}
}

// median returns the median of values (the mean of the two middle ones
// for an even count); 0 for none. values is not modified.
func median(values []float64) float64 {
	if len(values) == 0 {
		return 0
	}
	s := slices.Clone(values)
	slices.Sort(s)
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	return (s[mid-1] + s[mid]) / 2
}

// medianRound returns the index in rounds of the round whose key is the
// median of all the rounds' keys (the lower of the two middle ones for an
// even count, so that it is a round that was measured); -1 for none. Its
// Measurement stands for the subject in the table (phases, note).
func medianRound(rounds []RoundResult, key func(Figures) float64) int {
	if len(rounds) == 0 {
		return -1
	}
	idx := make([]int, len(rounds))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		ka, kb := key(rounds[a].Figures), key(rounds[b].Figures)
		switch {
		case ka < kb:
			return -1
		case ka > kb:
			return 1
		}
		return 0
	})
	return idx[(len(idx)-1)/2]
}

// medianFigures returns each figure's median over rounds. A figure that
// some round could not count (commits or server CPU, -1) is -1.
func medianFigures(rounds []RoundResult) Figures {
	if len(rounds) == 0 {
		return Figures{}
	}
	of := func(get func(Figures) float64) float64 {
		vs := make([]float64, len(rounds))
		for i, r := range rounds {
			if vs[i] = get(r.Figures); vs[i] < 0 {
				return -1
			}
		}
		return median(vs)
	}
	return Figures{
		TasksPerSec:            of(func(f Figures) float64 { return f.TasksPerSec }),
		MicrosPerTask:          of(func(f Figures) float64 { return f.MicrosPerTask }),
		P50Micros:              of(func(f Figures) float64 { return f.P50Micros }),
		P99Micros:              of(func(f Figures) float64 { return f.P99Micros }),
		MaxMicros:              of(func(f Figures) float64 { return f.MaxMicros }),
		StatementsPerTask:      of(func(f Figures) float64 { return f.StatementsPerTask }),
		CommitsPerTask:         of(func(f Figures) float64 { return f.CommitsPerTask }),
		XIDsPerTask:            of(func(f Figures) float64 { return f.XIDsPerTask }),
		WALBytesPerTask:        of(func(f Figures) float64 { return f.WALBytesPerTask }),
		ClientCPUMicrosPerTask: of(func(f Figures) float64 { return f.ClientCPUMicrosPerTask }),
		ServerCPUMicrosPerTask: of(func(f Figures) float64 { return f.ServerCPUMicrosPerTask }),
	}
}

// ratioSpread divides a's tasks/s by b's round by round, over the rounds
// both were measured in with a figure, and returns the Spread of those
// ratios; ok is false when no round has both.
func ratioSpread(a, b []RoundResult) (Spread, bool) {
	return ratioSpreadOf(a, b, func(f Figures) float64 { return f.TasksPerSec })
}

// latencyRatioSpread is ratioSpread of the p99s: above 1, a's is longer.
func latencyRatioSpread(a, b []RoundResult) (Spread, bool) {
	return ratioSpreadOf(a, b, func(f Figures) float64 { return f.P99Micros })
}

func ratioSpreadOf(a, b []RoundResult, figure func(Figures) float64) (Spread, bool) {
	var rounds []int
	var values []float64
	for _, ra := range a {
		for _, rb := range b {
			if ra.Round == rb.Round && figure(ra.Figures) > 0 && figure(rb.Figures) > 0 {
				rounds = append(rounds, ra.Round)
				values = append(values, figure(ra.Figures)/figure(rb.Figures))
			}
		}
	}
	if len(values) == 0 {
		return Spread{}, false
	}
	return spreadOf(rounds, values), true
}

// spreadText prints a ratio's Spread as its median and its range, as in
// "0.42× (0.38–0.47)"; a ratio of one round has no range to show.
func spreadText(s Spread) string {
	if len(s.Values) < 2 {
		return timesText(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", timesText(s.Median), trimTimes(s.Min), trimTimes(s.Max))
}

func timesText(r float64) string { return trimTimes(r) + "×" }

// trimTimes prints a ratio with two decimals below 10 and none above, as
// ratioText does.
func trimTimes(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.2f", r)
}
