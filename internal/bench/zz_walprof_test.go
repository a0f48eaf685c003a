package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/arborhq/arbor/tasks"
	"github.com/arborhq/arbor/internal/cputime"
)

// Scratch: WAL per task by relation for (a)'s runner. Not committed.
func TestZZWalProfile(t *testing.T) {
	url := os.Getenv("ARBOR_DATABASE_URL")
	n, _ := strconv.Atoi(os.Getenv("WALPROF_N"))
	if url == "" || n == 0 {
		t.Skip("scratch")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, _ = pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
	schema, drop, err := newSchema(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	if q := os.Getenv("WALPROF_SQL"); q != "" {
		if _, err := pool.Exec(ctx, `SET search_path TO "`+schema+`"; `+q+`; RESET search_path`); err != nil {
			t.Fatal(err)
		}
	}
	if os.Getenv("WALPROF_AFTER") != "" {
		q := `SET search_path TO "` + schema + `";
		DROP TRIGGER task_guard ON tasks;
		CREATE TRIGGER task_guard BEFORE INSERT OR DELETE ON tasks FOR EACH ROW EXECUTE FUNCTION task_guard();
		CREATE TRIGGER task_guard_upd AFTER UPDATE ON tasks FOR EACH ROW EXECUTE FUNCTION task_guard();
		DROP TRIGGER conversation_guard ON conversations;
		CREATE TRIGGER conversation_guard BEFORE INSERT OR DELETE ON conversations FOR EACH ROW EXECUTE FUNCTION conversation_guard();
		CREATE TRIGGER conversation_guard_upd AFTER UPDATE ON conversations FOR EACH ROW EXECUTE FUNCTION conversation_guard();
		RESET search_path`
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	env := &Env{Pool: pool, URL: url, Schema: schema, Conns: 8, ClaimBatch: 100, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	env.counter = &counter{}
	nr, err := startNoopRunner(ctx, env, n)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = pool.Exec(ctx, `CHECKPOINT`)
	_, _ = pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	pm := cputime.FindPostmaster(ctx, pool)
	srv0, _ := cputime.Server(pm)
	cli0 := cputime.Client()
	var from string
	pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&from)
	start := time.Now()
	if os.Getenv("WALPROF_ONE") != "" {
		err = parallel(ctx, 8, n, func(ctx context.Context, i int) error {
			_, _, err := nr.eng.Create(ctx, tasksCreate(fmt.Sprintf("flat-%d", i)))
			return err
		})
	} else {
		err = createNoops(ctx, env, nr.eng, "flat", n, insertBatch(n, 8))
	}
	if err != nil {
		t.Fatal(err)
	}
	<-nr.done
	el := time.Since(start)
	srv1, _ := cputime.Server(pm)
	fmt.Printf("server CPU %.1f µs/task, client %.1f µs/task\n", float64((srv1-srv0).Microseconds())/float64(n), float64((cputime.Client()-cli0).Microseconds())/float64(n))
	var to string
	pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&to)
	nr.stop()
	fmt.Printf("tasks/s %.0f\n", float64(n)/el.Seconds())
	{
		ss, err := pool.Query(ctx, `SELECT (total_exec_time*1000/$1)::numeric(10,1), (total_plan_time*1000/$1)::numeric(10,1), calls, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 150) FROM pg_stat_statements
			WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 25`, n)
		if err != nil { t.Fatal(err) }
		for ss.Next() { var a, b float64; var c, r int64; var q string; if err := ss.Scan(&a, &b, &c, &r, &q); err != nil { t.Fatal(err) }; fmt.Printf("%7.1f µs %5.1f plan %6d calls %7d rows  %s\n", a, b, c, r, q) }
		ss.Close()
	}
	{
		sig, err := pool.Query(ctx, `WITH r AS (
			SELECT xid::text::bigint AS xid, record_type, c.relname FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) w
			LEFT JOIN pg_class c ON c.relfilenode = (regexp_match(w.block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid
			WHERE c.relname IN ('tasks','conversations','conversation_log')),
		x AS (SELECT xid, string_agg(relname || ':' || record_type || '=' || n, ' ' ORDER BY relname, record_type) AS s
			FROM (SELECT xid, relname, record_type, count(*) n FROM r GROUP BY 1,2,3) y GROUP BY xid)
		SELECT s, count(*) FROM x GROUP BY s ORDER BY 2 DESC LIMIT 40`, from, to)
		if err != nil { t.Fatal(err) }
		for sig.Next() { var s string; var c int64; if err := sig.Scan(&s, &c); err != nil { t.Fatal(err) }; fmt.Printf("%6d  %s\n", c, s) }
		sig.Close(); if sig.Err() != nil { t.Fatal(sig.Err()) }
	}
	rows, err := pool.Query(ctx, `WITH r AS (
		SELECT resource_manager, record_type, description, record_length, fpi_length,
			(regexp_match(block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid AS fn
		FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn))
		SELECT coalesce(c.relname, r.resource_manager) || ' ' || r.record_type || CASE WHEN r.record_type='LOCK' THEN ' ' || regexp_replace(r.description, '^off \d+: xid \d+: ', '') ELSE '' END, sum(record_length)::bigint, sum(fpi_length)::bigint, count(*)
		FROM r LEFT JOIN pg_class c ON c.relfilenode = r.fn
		GROUP BY 1 ORDER BY 2 DESC`, from, to)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var total float64
	for rows.Next() {
		var name string
		var b, f, c int64
		rows.Scan(&name, &b, &f, &c)
		total += float64(b)
		fmt.Printf("%-45s %8.1f B/task (fpi %6.1f) %6.2f rec/task\n", name, float64(b)/float64(n), float64(f)/float64(n), float64(c)/float64(n))
	}
	fmt.Printf("TOTAL %.1f B/task\n", total/float64(n))
}

func tasksCreate(conv string) tasks.CreateParams {
	return tasks.CreateParams{ConversationID: conv, Kind: "noop"}
}
