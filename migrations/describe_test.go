package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// describe returns what schema holds, one line per object and sorted, with
// the schema's name written {schema}: each table's columns in their order
// (counted without dropped ones; type, nullability, default, identity),
// its options, constraints,
// indexes and triggers as PostgreSQL prints them back, each sequence, type
// and function (its whole definition), and every comment. Two schemas that
// describe the same hold the same objects defined the same way; the
// description is empty when the schema holds nothing.
func describe(t *testing.T, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schema string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1)
		SELECT 'column ' || c.relname || ' ' || (row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum))::text || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
			|| CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
			|| coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
			|| CASE a.attidentity WHEN 'a' THEN ' identity always' WHEN 'd' THEN ' identity by default' ELSE '' END
		FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
		LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
		WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT 'relation ' || c.relname || ' kind ' || c.relkind::text || coalesce(' options ' || array_to_string(c.reloptions, ','), '')
		FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'p', 'S', 'v', 'm')
		UNION ALL
		SELECT 'sequence ' || s.seqrelid::regclass::text || ' ' || format_type(s.seqtypid, NULL) || ' start ' || s.seqstart
			|| ' increment ' || s.seqincrement || ' min ' || s.seqmin || ' max ' || s.seqmax || ' cache ' || s.seqcache || ' cycle ' || s.seqcycle
		FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = (SELECT oid FROM ns)
		UNION ALL
		SELECT 'constraint ' || c.conrelid::regclass::text || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
			|| CASE WHEN c.condeferrable THEN ' deferrable' ELSE '' END || CASE WHEN c.condeferred THEN ' deferred' ELSE '' END
		FROM pg_constraint c WHERE c.connamespace = (SELECT oid FROM ns)
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(i.indexrelid)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = (SELECT oid FROM ns)
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(tg.oid) || ' enabled ' || tg.tgenabled::text
		FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
		WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT tg.tgisinternal
		UNION ALL
		SELECT 'function ' || pg_get_functiondef(p.oid)
		FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
		UNION ALL
		SELECT 'type ' || ty.typname || ' ' || ty.typtype::text
			|| coalesce(' ' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = ty.oid), '')
		FROM pg_type ty WHERE ty.typnamespace = (SELECT oid FROM ns) AND ty.typtype IN ('e', 'd', 'c')
			AND NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = ty.typrelid AND c.relkind <> 'c')
		UNION ALL
		SELECT 'comment ' || pg_describe_object(d.classoid, d.objoid, d.objsubid) || ' ' || d.description
		FROM pg_description d WHERE d.objoid IN (
			SELECT oid FROM pg_class WHERE relnamespace = (SELECT oid FROM ns)
			UNION ALL SELECT oid FROM pg_proc WHERE pronamespace = (SELECT oid FROM ns))
		ORDER BY 1`, schema)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	q := pgx.Identifier{schema}.Sanitize()
	for i, l := range lines {
		l = strings.ReplaceAll(l, q+".", "{schema}.")
		lines[i] = strings.ReplaceAll(l, schema+".", "{schema}.")
	}
	return lines
}
