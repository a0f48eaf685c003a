package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
)

// StatementShare is what one statement (by pg_stat_statements' queryid and
// level) cost the server in a window: the run's own statements only (those
// whose text names the run's schema), the statements that triggers and
// functions run among them (TopLevel false) when the server tracks nested
// statements (pg_stat_statements.track = all). A top-level statement's
// time includes the time of the nested ones it ran.
type StatementShare struct {
	Query    string  `json:"query"`
	TopLevel bool    `json:"top_level"`
	Calls    int64   `json:"calls"`
	Rows     int64   `json:"rows"`
	ExecMS   float64 `json:"exec_ms"`
	// PlanMS is the time spent planning it (its custom plans; a nested
	// statement that a function runs with EXECUTE is planned at each
	// call), 0 unless the server sets pg_stat_statements.track_planning.
	PlanMS   float64 `json:"plan_ms"`
	WALBytes int64   `json:"wal_bytes"`
}

// stmtKey names one pg_stat_statements entry.
type stmtKey struct {
	queryID  int64
	topLevel bool
}

// stmtSample is one read of the run's pg_stat_statements entries.
type stmtSample map[stmtKey]StatementShare

// setupStatements finds pg_stat_statements in the database; "" when it is
// not there (the server must load it: shared_preload_libraries).
func setupStatements(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	var schema string
	err := db.QueryRow(ctx, `SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
		WHERE e.extname = 'pg_stat_statements'`).Scan(&schema)
	if err != nil {
		return ""
	}
	return schema
}

// readStatements reads the entries of the statements whose text names the
// run's schema; nil when pg_stat_statements is not available.
func (e *Env) readStatements(ctx context.Context) stmtSample {
	if e.pgss == "" || e.Schema == "" {
		return nil
	}
	rows, err := e.Pool.Query(ctx, `SELECT queryid, toplevel, query, calls, rows, total_exec_time, total_plan_time, wal_bytes::bigint
		FROM `+pgx.Identifier{e.pgss, "pg_stat_statements"}.Sanitize()+`
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND strpos(query, $1) > 0`, e.Schema)
	if err != nil {
		e.Logger.WarnContext(ctx, "bench: could not read pg_stat_statements", "error", err)
		return nil
	}
	defer rows.Close()
	out := stmtSample{}
	for rows.Next() {
		var k stmtKey
		var s StatementShare
		if err := rows.Scan(&k.queryID, &k.topLevel, &s.Query, &s.Calls, &s.Rows, &s.ExecMS, &s.PlanMS, &s.WALBytes); err != nil {
			e.Logger.WarnContext(ctx, "bench: could not read pg_stat_statements", "error", err)
			return nil
		}
		s.TopLevel = k.topLevel
		s.Query = strings.Join(strings.Fields(s.Query), " ")
		s.Query = strings.ReplaceAll(s.Query, pgx.Identifier{e.Schema}.Sanitize()+".", "")
		s.Query = strings.ReplaceAll(s.Query, e.Schema+".", "")
		out[k] = s
	}
	if rows.Err() != nil {
		e.Logger.WarnContext(ctx, "bench: could not read pg_stat_statements", "error", rows.Err())
		return nil
	}
	return out
}

// statementsBetween is what each statement did between two samples, its
// calls, rows, time and WAL, largest time first; entries without a call in
// between are left out. An entry the server evicted in between (more
// statements than pg_stat_statements.max) counts from zero.
func statementsBetween(before, after stmtSample) []StatementShare {
	var out []StatementShare
	for k, a := range after {
		b := before[k]
		d := StatementShare{Query: a.Query, TopLevel: a.TopLevel, Calls: a.Calls - b.Calls, Rows: a.Rows - b.Rows,
			ExecMS: a.ExecMS - b.ExecMS, PlanMS: a.PlanMS - b.PlanMS, WALBytes: a.WALBytes - b.WALBytes}
		if b.Calls > a.Calls { // evicted and counted again
			d = a
		}
		if d.Calls > 0 {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(x, y StatementShare) int {
		switch {
		case x.ExecMS+x.PlanMS > y.ExecMS+y.PlanMS:
			return -1
		case x.ExecMS+x.PlanMS < y.ExecMS+y.PlanMS:
			return 1
		}
		return strings.Compare(x.Query, y.Query)
	})
	return out
}

// statementsShown is how many of a run's statements printStatements lists.
const statementsShown = 24

// printStatements lists, for every measured run that read its statements
// (Options.Statements), the largest by time, per task (the median round's
// run).
func printStatements(w io.Writer, s Scenario, res ScenarioResult, unit string) {
	for _, sub := range s.Subjects {
		for _, sr := range res.Sizes {
			for _, r := range sr.Subjects {
				if r.Key != sub.Key || r.Measurement == nil || len(r.Measurement.ByStatement) == 0 || r.Measurement.Tasks == 0 {
					continue
				}
				m := r.Measurement
				n := float64(m.Tasks)
				fmt.Fprintf(w, "  statements, %s at %s, per %s (pg_stat_statements; nested: run by a trigger or function, its time inside its caller's; largest %d of %d by time):\n",
					sub.Key, sr.Size.Spec, unit, min(statementsShown, len(m.ByStatement)), len(m.ByStatement))
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "    exec µs\tplan µs\tcalls\trows\tWAL bytes\tlevel\tstatement")
				for _, st := range m.ByStatement[:min(statementsShown, len(m.ByStatement))] {
					level := "top"
					if !st.TopLevel {
						level = "nested"
					}
					q := st.Query
					if len(q) > 110 {
						q = q[:110] + "…"
					}
					fmt.Fprintf(tw, "    %.1f\t%.1f\t%.4f\t%.3f\t%.1f\t%s\t%s\n", st.ExecMS*1000/n, st.PlanMS*1000/n, float64(st.Calls)/n, float64(st.Rows)/n,
						float64(st.WALBytes)/n, level, q)
				}
				_ = tw.Flush()
			}
		}
	}
}
