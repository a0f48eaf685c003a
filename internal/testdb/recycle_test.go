package testdb

import (
	"context"
	"os"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestRecycledSchemaIsAsFresh: a schema handed back after a test wrote
// rows, drew from a sequence and took statistics comes back to the next
// test empty, its sequences restarted and without statistics; one whose
// catalog a test changed is dropped, and the next test gets another. Not
// parallel: it counts on being the only test of the package that lends.
func TestRecycledSchemaIsAsFresh(t *testing.T) {
	ctx := context.Background()
	pool := NewPool(t)
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	lend := func() (string, func()) {
		t.Helper()
		schema, giveBack, err := Lend(pool)
		if err != nil {
			t.Fatal(err)
		}
		return schema, giveBack
	}

	first, giveBack := lend()
	exec(`INSERT INTO ` + first + `.river_queue (name, created_at, metadata, updated_at) SELECT 'q' || i, now(), '{}', now() FROM generate_series(1, 50) i`)
	exec(`SELECT nextval('` + first + `.tasks_id_seq')`)
	exec(`ANALYZE ` + first + `.river_queue`)
	statistics := `SELECT count(*) FROM pg_statistic s JOIN pg_class c ON c.oid = s.starelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`
	if count(statistics, first) == 0 {
		t.Fatal("ANALYZE took no statistics: the test proves nothing")
	}
	giveBack()

	again, giveBack := lend()
	if again != first {
		t.Fatalf("got schema %s, want the recycled %s", again, first)
	}
	if n := count(`SELECT count(*) FROM ` + again + `.river_queue`); n != 0 {
		t.Errorf("the recycled schema holds %d rows of river_queue, want none", n)
	}
	if n := count(`SELECT nextval('` + again + `.tasks_id_seq')`); n != 1 {
		t.Errorf("tasks_id_seq gives %d, want 1", n)
	}
	if n := count(statistics, again); n != 0 {
		t.Errorf("the recycled schema keeps %d rows of statistics, want none", n)
	}
	if n := count(`SELECT count(*) FROM ` + again + `.arbor_migrations`); n == 0 {
		t.Error("the recycled schema lost its migration rows")
	}
	exec(`ALTER TABLE ` + again + `.tasks SET (autovacuum_enabled = false)`)
	giveBack()

	other, giveBack := lend()
	defer giveBack()
	if other == first {
		t.Fatalf("a schema whose catalog changed was handed out again")
	}
	if n := count(`SELECT count(*) FROM pg_namespace WHERE nspname = $1`, first); n != 0 {
		t.Errorf("the changed schema %s was not dropped", first)
	}
}
