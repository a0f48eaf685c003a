package testdb

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Inside a package whose TestMain is Main, a schema of a test's own
// (Schema, Fresh) is not dropped when the test ends but emptied and handed
// to the next test that asks for one, so that the package migrates about
// as many schemas as it runs tests at once, not one per test. A schema
// goes back only when it is as a fresh one would be:
//
//   - its catalog (tables, columns, defaults, constraints, indexes,
//     triggers and whether they are enabled, functions, types, sequences'
//     parameters, privileges, owners) and the rows of its two migration
//     tables are what they were just after it was migrated (a test that
//     created a table, dropped a trigger, granted something or migrated
//     down leaves a schema that is dropped instead);
//   - every other table (arbor's and River's) is truncated, every sequence
//     restarted, and the tables' statistics and activity counters removed,
//     so that a test of plans without statistics finds none and autovacuum
//     counts from zero.
//
// Anything that fails on the way drops the schema, as before. Outside Main
// (arbortest.Schema in a user's package) nothing is recycled: nobody would
// drop the spares at the end.
var spare struct {
	sync.Mutex
	// on is set by Main for the run of the package's tests.
	on bool
	// admin empties and drops the schemas, whatever became of the pool
	// of the test that used them.
	admin *pgxpool.Pool
	// free are the emptied schemas no test holds, print each recycled
	// schema's fingerprint just after its migration.
	free  []string
	print map[string]string
}

// recycling turns recycling on for Main's run of the tests.
func recycling() {
	spare.Lock()
	defer spare.Unlock()
	spare.on, spare.print = true, map[string]string{}
}

// dropSpares drops every schema recycling made, held or not (a test that
// timed out may still hold one), and ends recycling.
func dropSpares() {
	spare.Lock()
	defer spare.Unlock()
	if spare.admin != nil {
		for schema := range spare.print {
			dropSchema(spare.admin, schema)
		}
		spare.admin.Close()
	}
	spare.on, spare.admin, spare.free, spare.print = false, nil, nil, nil
}

// takeSpare returns an emptied schema no test holds, or "" when there is
// none (or recycling is off).
func takeSpare() string {
	spare.Lock()
	defer spare.Unlock()
	if len(spare.free) == 0 {
		return ""
	}
	schema := spare.free[len(spare.free)-1]
	spare.free = spare.free[:len(spare.free)-1]
	return schema
}

// remember records the fingerprint of a schema just migrated, so that it
// can be recycled; a schema whose fingerprint cannot be read is simply
// dropped at the end of its test.
func remember(pool *pgxpool.Pool, schema string) {
	spare.Lock()
	on := spare.on
	spare.Unlock()
	if !on {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	print, err := fingerprint(ctx, pool, schema)
	if err != nil {
		return
	}
	spare.Lock()
	defer spare.Unlock()
	if spare.on {
		spare.print[schema] = print
	}
}

// release hands schema back at the end of its test: emptied and made
// available when it can be recycled, dropped otherwise.
func release(pool *pgxpool.Pool, schema string) {
	spare.Lock()
	want, known := spare.print[schema]
	admin, err := adminPool()
	spare.Unlock()
	if !known || err != nil {
		dropSchema(pool, schema)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := reset(ctx, admin, schema, want); err != nil {
		spare.Lock()
		delete(spare.print, schema)
		spare.Unlock()
		dropSchema(admin, schema)
		return
	}
	spare.Lock()
	defer spare.Unlock()
	spare.free = append(spare.free, schema)
}

// adminPool returns the pool that empties and drops recycled schemas,
// opening it on first use. The caller holds spare's lock.
func adminPool() (*pgxpool.Pool, error) {
	if spare.admin == nil {
		url, err := urlFromEnv()
		if err != nil {
			return nil, err
		}
		if spare.admin, err = openPoolOf(url, 4); err != nil {
			return nil, err
		}
	}
	return spare.admin, nil
}

// reset empties schema if its fingerprint is still want, and fails
// otherwise: one transaction that truncates every table but the migration
// tables (with the triggers off: arbor's record guards refuse a TRUNCATE,
// and a superuser's session_replication_role is what the tests that forge
// rows use too), restarts every sequence, and removes the statistics and
// counters of every table. A lock that some session of the test still
// holds makes it fail after lock_timeout rather than wait for ever.
func reset(ctx context.Context, admin *pgxpool.Pool, schema, want string) error {
	return pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
			return err
		}
		got, err := fingerprint(ctx, tx, schema)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("schema %s changed since it was migrated", schema)
		}
		var tables []string
		rows, err := tx.Query(ctx, `SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relkind::text IN ('r', 'p') AND c.relname NOT IN ('arbor_migrations', 'river_migration')
			ORDER BY c.relname`, schema)
		if err != nil {
			return err
		}
		if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		if len(tables) > 0 {
			if _, err := tx.Exec(ctx, `TRUNCATE `+strings.Join(tables, ", ")+` RESTART IDENTITY`); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `SELECT setval(format('%I.%I', schemaname, sequencename), start_value, false)
			FROM pg_sequences WHERE schemaname = $1`, schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM pg_statistic s USING pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE s.starelid = c.oid AND n.nspname = $1`, schema); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pg_stat_reset_single_table_counters(c.oid)
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1`, schema)
		return err
	})
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// fingerprint returns a digest of schema's catalog and of its migration
// tables' rows: equal digests mean a test changed neither.
func fingerprint(ctx context.Context, db querier, schema string) (string, error) {
	var catalog string
	if err := db.QueryRow(ctx, fingerprintSQL, schema).Scan(&catalog); err != nil {
		return "", fmt.Errorf("fingerprint %s: %w", schema, err)
	}
	s := pgx.Identifier{schema}.Sanitize()
	var applied string
	if err := db.QueryRow(ctx, `SELECT coalesce((SELECT string_agg(version || ' ' || name, ',' ORDER BY version) FROM `+s+`.arbor_migrations), '')
		|| ';' || coalesce((SELECT string_agg(line || ' ' || version, ',' ORDER BY line, version) FROM `+s+`.river_migration), '')`).Scan(&applied); err != nil {
		return "", fmt.Errorf("fingerprint %s: %w", schema, err)
	}
	return catalog + ";" + applied, nil
}

// fingerprintSQL digests what a test could change in a schema's catalog.
const fingerprintSQL = `WITH ns AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = $1)
SELECT md5(coalesce(string_agg(x, E'\n' ORDER BY x), '')) FROM (
	SELECT 'n ' || nspowner::regrole::text || ' ' || coalesce(nspacl::text, '') AS x FROM pg_namespace WHERE oid = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'c ' || c.relname || ' ' || c.relkind::text || ' ' || c.relpersistence::text || ' ' || c.relowner::regrole::text || ' ' || coalesce(c.relacl::text, '')
		|| ' ' || coalesce(c.reloptions::text, '') || ' ' || c.relrowsecurity || ' ' || c.relforcerowsecurity || ' ' || c.relreplident::text
		|| ' ' || CASE WHEN c.relkind::text IN ('v', 'm') THEN pg_get_viewdef(c.oid) ELSE '' END
		FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'a ' || c.relname || ' ' || a.attnum || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull
		|| ' ' || a.attisdropped || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' ' || coalesce(a.attacl::text, '')
		|| ' ' || coalesce(a.attoptions::text, '') || ' ' || coalesce(a.attstattarget::text, '')
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE c.relnamespace = (SELECT oid FROM ns) AND a.attnum > 0
	UNION ALL
	SELECT 'k ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid) || ' ' || convalidated
		FROM pg_constraint WHERE connamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'i ' || pg_get_indexdef(i.indexrelid) || ' ' || i.indisvalid || ' ' || i.indisready
		FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'g ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
		FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'r ' || r.rulename || ' ' || r.ev_class::regclass::text || ' ' || r.ev_enabled::text || ' ' || md5(r.ev_action::text)
		FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'p ' || pol.polname || ' ' || pol.polrelid::regclass::text || ' ' || coalesce(pg_get_expr(pol.polqual, pol.polrelid), '')
		|| ' ' || coalesce(pg_get_expr(pol.polwithcheck, pol.polrelid), '')
		FROM pg_policy pol JOIN pg_class c ON c.oid = pol.polrelid WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'f ' || p.oid::regprocedure::text || ' ' || p.prokind::text || ' ' || p.provolatile::text || ' ' || p.prosecdef || ' ' || p.proowner::regrole::text
		|| ' ' || coalesce(p.proacl::text, '') || ' ' || coalesce(p.proconfig::text, '') || ' ' || p.prorettype::regtype::text || ' ' || md5(coalesce(p.prosrc, ''))
		FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 't ' || t.typname || ' ' || t.typtype::text || ' ' || t.typowner::regrole::text || ' ' || coalesce(t.typacl::text, '')
		|| ' ' || coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid), '')
		FROM pg_type t WHERE t.typnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 's ' || c.relname || ' ' || s.seqtypid::regtype::text || ' ' || s.seqstart || ' ' || s.seqincrement || ' ' || s.seqmax
		|| ' ' || s.seqmin || ' ' || s.seqcache || ' ' || s.seqcycle
		FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'x ' || x.stxname FROM pg_statistic_ext x WHERE x.stxnamespace = (SELECT oid FROM ns)
	UNION ALL
	SELECT 'd ' || d.defaclobjtype::text || ' ' || d.defaclrole::regrole::text || ' ' || d.defaclacl::text
		FROM pg_default_acl d WHERE d.defaclnamespace = (SELECT oid FROM ns)
) parts`
