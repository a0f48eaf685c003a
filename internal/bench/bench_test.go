package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/bench"
	"github.com/arborhq/arbor/internal/testdb"
)

// TestRunTiny runs every scenario at tiny sizes in two rounds against the
// real database, DBOS and go-workflows left out (building them takes longer
// than the whole test should): each runnable subject must produce a figure in each of its
// rounds, each ratio one per round, the pending scenarios must say why, and
// the JSON must read back. The scenarios run in four groups side by side,
// each a Run of its own (Options.Only), because one after the other they
// took two minutes of the suite's three, most of it waiting; the figures
// of a smoke test are not compared with anything.
func TestRunTiny(t *testing.T) {
	t.Parallel()
	const groups = 4
	var keys []string
	for _, s := range bench.Scenarios() {
		keys = append(keys, s.Key)
	}
	for g := range groups {
		var only []string
		for i := g; i < len(keys); i += groups {
			only = append(only, keys[i])
		}
		t.Run(strings.Join(only, ""), func(t *testing.T) {
			t.Parallel()
			runTiny(t, only)
		})
	}
}

// runTiny is one group of TestRunTiny: the scenarios only names.
func runTiny(t *testing.T, only []string) {
	var out bytes.Buffer
	rep, err := bench.Run(context.Background(), bench.Options{
		Only:        only,
		DatabaseURL: testdb.URL(t),
		Conns:       4,
		ClaimBatch:  7,
		Rounds:      2,
		Sizes: map[string][]string{
			"a": {"10", "30"},
			"b": {"2x3", "1x10"},
			"c": {"10", "40"},
			"d": {"10", "13"},
			"e": {"5", "20"},
			"f": {"3", "10"},
			"g": {"3", "5"},
			"h": {"2x2", "2x3"},
			"i": {"3", "5"},
			"j": {"3", "4"},
			"k": {"3", "5"},
			"l": {"10", "30"},
			"m": {"3", "5"},
			"n": {"3", "5"},
			"o": {"3", "5"},
		},
		// River alone wakes a sleep only when it promotes its scheduled
		// job, every ~5 s: seconds per size, too slow for the smoke test.
		Leave:      []string{"e/river-only"},
		WakeSpread: 200 * time.Millisecond,
		// A runner's machine that finds every worker slot taken waits for
		// its poll (1 s by default): seconds per size.
		RunnerPollInterval: 20 * time.Millisecond,
		Out:                &out,
		Logger:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)

	require.Len(t, rep.Scenarios, len(only))
	for _, s := range rep.Scenarios {
		if s.Pending != "" {
			require.Empty(t, s.Sizes, s.Key)
			require.Contains(t, out.String(), s.Pending)
			continue
		}
		require.Len(t, s.Sizes, 2, s.Key)
		def := scenario(s.Key)
		for _, sr := range s.Sizes {
			wantRounds := 2
			if def.MaxRounds > 0 {
				wantRounds = min(wantRounds, def.MaxRounds)
			}
			require.Equal(t, wantRounds, sr.Rounds, s.Key)
			for k, r := range sr.Subjects {
				if sub := def.Subjects[k]; sub.Subprocess != "" {
					require.Contains(t, r.Unavailable, "not run", "%s is left out, and says so", r.Key)
					continue
				}
				if s.Key == "e" && r.Key == "river-only" {
					require.Contains(t, r.Unavailable, "left out")
					continue
				}
				require.Empty(t, r.Error, "%s %s %s", s.Key, r.Key, sr.Size.Spec)
				require.NotNil(t, r.Measurement, "%s %s %s", s.Key, r.Key, sr.Size.Spec)
				require.Equal(t, sr.Size.Tasks, r.Measurement.Tasks)
				require.Positive(t, r.TasksPerSec)
				subRounds := wantRounds
				if capped := def.Subjects[k].MaxRounds; capped > 0 {
					subRounds = min(subRounds, capped)
				}
				require.Len(t, r.Rounds, subRounds, "%s %s %s", s.Key, r.Key, sr.Size.Spec)
				for i, round := range r.Rounds {
					require.Equal(t, i+1, round.Round)
					require.Positive(t, round.TasksPerSec)
					require.Equal(t, sr.Size.Tasks, round.Measurement.Tasks)
				}
				require.Positive(t, r.Measurement.Statements, "%s %s: statements counted", s.Key, r.Key)
				require.Positive(t, r.Measurement.XIDs, "%s %s: transaction ids counted", s.Key, r.Key)
				require.Positive(t, r.Measurement.Commits, "%s %s: commits counted", s.Key, r.Key)
				if def.Metric == bench.Latency {
					// (f) notes no latency for a parent whose child had
					// settled before it waited.
					require.NotEmpty(t, r.Measurement.Latencies, "%s %s", s.Key, r.Key)
					require.LessOrEqual(t, len(r.Measurement.Latencies), sr.Size.N, "%s %s", s.Key, r.Key)
					require.Positive(t, r.P50Micros)
					require.GreaterOrEqual(t, r.MaxMicros, r.P99Micros)
					require.GreaterOrEqual(t, r.P99Micros, r.P50Micros)
				}
			}
		}
		subjects := map[string]bench.Subject{}
		for _, sub := range scenario(s.Key).Subjects {
			subjects[sub.Key] = sub
		}
		for _, a := range s.Sizes[0].Subjects {
			for _, b := range s.Sizes[0].Subjects {
				if subjects[a.Key].Compared(subjects[b.Key]) && b.Unavailable == "" {
					ratio := a.Ratios[b.Key]
					require.Positive(t, ratio.Median, "%s: ratio of %s to %s", s.Key, a.Key, b.Key)
					require.Len(t, ratio.Values, min(len(a.Rounds), len(b.Rounds)), "%s: one ratio per round of both", s.Key)
					require.LessOrEqual(t, ratio.Min, ratio.Median)
					require.GreaterOrEqual(t, ratio.Max, ratio.Median)
					require.Contains(t, out.String(), a.Key+"÷"+b.Key)
				}
			}
		}
	}
	require.Positive(t, rep.PeakRSSBytes)
	require.Contains(t, out.String(), "peak memory")
	if rep.Scenarios[0].Key != "a" {
		return
	}
	require.Contains(t, out.String(), "(a) flat")
	require.Contains(t, out.String(), "median (min–max)")

	path := filepath.Join(t.TempDir(), "results.json")
	require.NoError(t, rep.WriteJSON(path))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var back bench.Report
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, rep.Scenarios[0].Sizes[1].Subjects[0].TasksPerSec, back.Scenarios[0].Sizes[1].Subjects[0].TasksPerSec)
	require.Equal(t, rep.Scenarios[0].Sizes[1].Subjects[0].Rounds[1].TasksPerSec, back.Scenarios[0].Sizes[1].Subjects[0].Rounds[1].TasksPerSec)
	require.Equal(t, rep.Scenarios[0].Sizes[1].Subjects[0].Ratios["river"], back.Scenarios[0].Sizes[1].Subjects[0].Ratios["river"])

}

func scenario(key string) bench.Scenario {
	for _, s := range bench.Scenarios() {
		if s.Key == key {
			return s
		}
	}
	panic("no scenario " + key)
}

func TestOptionsRefused(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]bench.Options{
		"no url":        {},
		"unknown only":  {DatabaseURL: "postgres://x", Only: []string{"z"}},
		"unknown sizes": {DatabaseURL: "postgres://x", Sizes: map[string][]string{"z": {"1"}}},
		"bad conns":     {DatabaseURL: "postgres://x", Conns: -1},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := bench.Run(context.Background(), o)
			require.Error(t, err)
		})
	}
	_, err := bench.Run(context.Background(), bench.Options{DatabaseURL: "postgres://nowhere.invalid/x", Only: []string{"c"},
		Sizes: map[string][]string{"c": {"ten"}}})
	require.ErrorContains(t, err, `size "ten"`, "sizes are read before connecting")
}

// TestWALByRelation: with Options.WALByRelation a run reports the WAL it
// wrote by relation and record type, the task table's inserts among it,
// and the shares sum to no more than the run's WAL.
func TestWALByRelation(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	rep, err := bench.Run(context.Background(), bench.Options{
		DatabaseURL:        testdb.URL(t),
		Conns:              4,
		Rounds:             1,
		Only:               []string{"a"},
		Sizes:              map[string][]string{"a": {"20", "30"}},
		Leave:              []string{"a/arbor", "a/runner-create", "a/ceiling", "a/ceiling-row", "a/river"},
		RunnerPollInterval: 20 * time.Millisecond,
		WALByRelation:      true,
		Out:                &out,
		Logger:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	require.Contains(t, out.String(), "WAL by relation, runner at 20")
	for _, s := range rep.Scenarios {
		for _, sr := range s.Sizes {
			for _, r := range sr.Subjects {
				if r.Measurement == nil {
					continue
				}
				var sum int64
				inserts := false
				for _, sh := range r.Measurement.WAL {
					sum += sh.Bytes
					inserts = inserts || (sh.Relation == "tasks" && sh.Record == "INSERT")
				}
				require.True(t, inserts, "%s at %s: the tasks' inserts are among its WAL: %+v", r.Key, sr.Size.Spec, r.Measurement.WAL)
				require.LessOrEqual(t, sum, r.Measurement.WALBytes)
			}
		}
	}
}

// TestByStatementAndWhatIf: with Options.ByStatement a run lists its
// statements from pg_stat_statements, the tasks' insert among them with
// its calls and WAL, when the server has the extension, and says it cannot
// when it has not; Options.WhatIfSQL runs in each run's schema ({schema}
// filled in) before the run, and a what-if that fails voids the run,
// saying why.
func TestByStatementAndWhatIf(t *testing.T) {
	t.Parallel()
	run := func(whatIf string) (*bench.Report, string) {
		var out bytes.Buffer
		rep, err := bench.Run(context.Background(), bench.Options{
			DatabaseURL:        testdb.URL(t),
			Conns:              4,
			Rounds:             1,
			Only:               []string{"a"},
			Sizes:              map[string][]string{"a": {"20"}},
			Leave:              []string{"a/arbor", "a/runner-create", "a/ceiling", "a/ceiling-row", "a/river"},
			RunnerPollInterval: 20 * time.Millisecond,
			ByStatement:        true,
			// The package's runs share recycled schemas (main_test.go):
			// a what-if here must change nothing.
			WhatIfSQL: whatIf,
			Out:       &out,
			Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		require.NoError(t, err)
		return rep, out.String()
	}
	runner := func(rep *bench.Report) bench.SubjectResult {
		for _, r := range rep.Scenarios[0].Sizes[0].Subjects {
			if r.Key == "runner" {
				return r
			}
		}
		t.Fatal("no runner subject")
		return bench.SubjectResult{}
	}

	rep, out := run(`SELECT count(*) FROM {schema}.tasks; SELECT count(*) FROM {schema}.conversations`)
	r := runner(rep)
	require.Empty(t, r.Error)
	require.NotNil(t, r.Measurement)
	if strings.Contains(out, "pg_stat_statements is not available") {
		require.Empty(t, r.Measurement.ByStatement)
		t.Log("the server does not load pg_stat_statements: its listing is not checked")
	} else {
		require.Contains(t, out, "statements, runner at 20")
		found := false
		for _, st := range r.Measurement.ByStatement {
			if st.TopLevel && strings.Contains(st.Query, "INSERT INTO tasks") {
				found = true
				require.Positive(t, st.Calls, st.Query)
				require.Positive(t, st.WALBytes, st.Query)
			}
		}
		require.True(t, found, "the tasks' insert is among the run's statements: %+v", r.Measurement.ByStatement)
	}

	rep, _ = run(`SELECT * FROM {schema}.no_such_table`)
	r = runner(rep)
	require.Contains(t, r.Error, "what-if SQL")
	require.Nil(t, r.Measurement)
}
