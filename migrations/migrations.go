package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

//go:embed sql/*.sql
var files embed.FS

// SchemaDefault is the schema arbor uses when none is given.
const SchemaDefault = "arbor"

// migration is one numbered step: what its up and down run, with the
// placeholder {schema} where the schema's quoted name goes (see mustLoad).
type migration struct {
	version  int
	name     string
	up, down string
}

// versionTable is the table in which the Migrator records the versions
// applied to a schema. Each migration's SQL, as applied and as exported,
// creates it if need be and records its version there; the baseline's
// down drops it.
const versionTable = `CREATE TABLE IF NOT EXISTS {schema}.arbor_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
`

var (
	all    = mustLoad()
	nameRE = regexp.MustCompile(`^([0-9]{3})_([a-z0-9_]+)\.(up|down)\.sql$`)
	// schemaRE is what arbor accepts as a schema name: a plain identifier,
	// which is also what River accepts.
	schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

// Latest is the version this build of arbor creates and expects.
func Latest() int { return all[len(all)-1].version }

// Versions returns the version of every migration this build knows, oldest
// first: 1 is the v0.1.0 baseline.
func Versions() []int {
	out := make([]int, len(all))
	for i, m := range all {
		out[i] = m.version
	}
	return out
}

// SQL returns the up and down SQL of migration version, written for schema
// ("" means [SchemaDefault]): the statements [Migrator.Up] and
// [Migrator.Down] run for that version, for a team that applies arbor's
// migrations with its own tool (docs/operations.md). The up ends by
// recording the version in <schema>.arbor_migrations (created if need
// be), which [Check] reads; the down removes that row (the baseline's
// drops the table). It is arbor's SQL only: River's tables, which the
// Migrator creates after arbor's, come from River's own migrations. The
// schema must exist. An unknown version or a bad schema name is an error
// wrapping arbortype.ErrInvalidArgument.
func SQL(version int, schema string) (up, down string, err error) {
	if schema == "" {
		schema = SchemaDefault
	}
	if err := ValidateSchema(schema); err != nil {
		return "", "", err
	}
	if version < 1 || version > Latest() {
		return "", "", fmt.Errorf("migration %d is outside 1..%d: %w", version, Latest(), arbortype.ErrInvalidArgument)
	}
	m := all[version-1]
	return render(m.up, schema), render(m.down, schema), nil
}

func mustLoad() []migration {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		panic(err)
	}
	byVersion := map[int]*migration{}
	for _, e := range entries {
		m := nameRE.FindStringSubmatch(e.Name())
		if m == nil {
			panic("migrations: badly named file " + e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &migration{version: v, name: m[2]}
			byVersion[v] = mig
		}
		if m[3] == "up" {
			mig.up = string(body)
		} else {
			mig.down = string(body)
		}
	}
	// What each runs beyond its files: the record of its version.
	for v, mig := range byVersion {
		if mig.up == "" || mig.down == "" {
			continue // refused below
		}
		record := fmt.Sprintf("INSERT INTO {schema}.arbor_migrations (version, name) VALUES (%d, '%s');\n", v, mig.name)
		mig.up += "\n-- The Migrator's record of this version (migrations.Check reads it).\n" + versionTable + record
		mig.down += fmt.Sprintf("\n-- The Migrator's record of this version.\nDELETE FROM {schema}.arbor_migrations WHERE version = %d;\n", v)
		if v == 1 {
			mig.down += "DROP TABLE {schema}.arbor_migrations;\n"
		}
	}
	var out []migration
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			panic(fmt.Sprintf("migrations: version %d lacks an up or a down file", m.version))
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			panic(fmt.Sprintf("migrations: version %d is missing", i+1))
		}
	}
	return out
}

// ValidateSchema returns an error unless schema is a plain lower-case
// identifier of at most 63 bytes.
func ValidateSchema(schema string) error {
	if !schemaRE.MatchString(schema) {
		return fmt.Errorf("schema %q: must be a lower-case identifier (letters, digits, underscores; at most 63 bytes): %w", schema, arbortype.ErrInvalidArgument)
	}
	return nil
}

// Migrator applies arbor's migrations, and River's, to one schema.
type Migrator struct {
	pool   *pgxpool.Pool
	schema string
	logger *slog.Logger
}

// New returns a Migrator for schema ("" means [SchemaDefault]). The pool is
// the caller's; the migrator never closes it.
func New(pool *pgxpool.Pool, schema string, logger *slog.Logger) (*Migrator, error) {
	if schema == "" {
		schema = SchemaDefault
	}
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Migrator{pool: pool, schema: schema, logger: logger}, nil
}

func (m *Migrator) render(sql string) string { return render(sql, m.schema) }

// render writes sql for schema: the placeholder {schema} becomes its quoted
// name.
func render(sql, schema string) string {
	return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{schema}.Sanitize())
}

// Version returns the schema's arbor version: 0 when arbor was never applied.
func (m *Migrator) Version(ctx context.Context) (int, error) {
	return Version(ctx, m.pool, m.schema)
}

// Up applies every migration not yet applied, then River's, and returns the
// versions it applied (empty when the schema was up to date already). The
// pool's role must own the schema; it needs CREATE on the database only
// when the schema does not exist yet, for Up creates it then.
func (m *Migrator) Up(ctx context.Context) ([]int, error) {
	var applied []int
	err := m.locked(ctx, func(conn *pgxpool.Conn) error {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := m.createSchema(ctx, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, m.render(versionTable)); err != nil {
				return err
			}
			current, err := versionTx(ctx, tx, m.schema)
			if err != nil {
				return err
			}
			if current > Latest() {
				return &VersionError{Schema: m.schema, Have: current, Want: Latest()}
			}
			for _, mig := range all[current:] {
				if _, err := tx.Exec(ctx, m.render(mig.up)); err != nil {
					return fmt.Errorf("migration %03d_%s up: %w", mig.version, mig.name, err)
				}
				applied = append(applied, mig.version)
				m.logger.InfoContext(ctx, "arbor migration applied", slog.String("schema", m.schema), slog.Int("version", mig.version), slog.String("name", mig.name))
			}
			return nil
		})
		if err != nil {
			return err
		}
		return m.river(ctx, rivermigrate.DirectionUp, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("migrate schema %s up: %w", m.schema, classify(err))
	}
	return applied, nil
}

// createSchema creates the schema unless it exists. It looks first, because
// PostgreSQL checks CREATE on the database before it looks whether the
// schema exists, even for CREATE SCHEMA IF NOT EXISTS: a migration role that
// owns a schema made for it by an administrator, as docs/operations.md
// describes, must not need to create schemas. The migrator's advisory lock
// keeps another migrator from creating it between the look and the create.
func (m *Migrator) createSchema(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, m.schema).Scan(&exists); err != nil {
		return fmt.Errorf("look for schema: %w", err)
	}
	if exists {
		return nil
	}
	if _, err := tx.Exec(ctx, m.render(`CREATE SCHEMA {schema}`)); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

// Down reverts arbor's migrations above target, newest first, and returns the
// versions it reverted. Down to 0 removes every arbor table and River's
// tables too; the schema itself is left in place.
func (m *Migrator) Down(ctx context.Context, target int) ([]int, error) {
	if target < 0 || target > Latest() {
		return nil, fmt.Errorf("migrate schema %s down: target %d is outside 0..%d: %w", m.schema, target, Latest(), arbortype.ErrInvalidArgument)
	}
	var reverted []int
	err := m.locked(ctx, func(conn *pgxpool.Conn) error {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			current, err := versionTx(ctx, tx, m.schema)
			if err != nil {
				return err
			}
			if current > Latest() {
				return &VersionError{Schema: m.schema, Have: current, Want: Latest()}
			}
			for v := current; v > target; v-- {
				mig := all[v-1]
				if _, err := tx.Exec(ctx, m.render(mig.down)); err != nil {
					return fmt.Errorf("migration %03d_%s down: %w", mig.version, mig.name, err)
				}
				reverted = append(reverted, v)
			}
			return nil
		})
		if err != nil || target != 0 {
			return err
		}
		return m.river(ctx, rivermigrate.DirectionDown, &rivermigrate.MigrateOpts{TargetVersion: -1})
	})
	if err != nil {
		return nil, fmt.Errorf("migrate schema %s down: %w", m.schema, classify(err))
	}
	return reverted, nil
}

// locked runs fn holding a session advisory lock on a connection of its own,
// so that two migrators of the same schema take turns.
func (m *Migrator) locked(ctx context.Context, fn func(conn *pgxpool.Conn) error) error {
	conn, err := m.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	key := "arbor.migrate." + m.schema
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, key); err != nil {
		return err
	}
	defer func() {
		// A fresh context: the lock must go even if ctx was cancelled. If the
		// unlock fails the connection is closed, which releases it too.
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext($1))`, key); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	return fn(conn)
}

func (m *Migrator) river(ctx context.Context, dir rivermigrate.Direction, opts *rivermigrate.MigrateOpts) error {
	rm, err := rivermigrate.New(riverpgxv5.New(m.pool), &rivermigrate.Config{Schema: m.schema, Logger: m.logger})
	if err != nil {
		return err
	}
	if dir == rivermigrate.DirectionDown {
		versions, err := rm.ExistingVersions(ctx)
		if err != nil || len(versions) == 0 {
			// No River tables (or no migration table): nothing to remove.
			return nil
		}
	}
	if _, err := rm.Migrate(ctx, dir, opts); err != nil {
		return fmt.Errorf("river migrations %s: %w", dir, err)
	}
	return nil
}

// Querier is what [Version] and [Check] need: a pool, a connection or a
// transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Version returns the arbor version of schema: 0 when arbor's version table
// does not exist there.
func Version(ctx context.Context, db Querier, schema string) (int, error) {
	v, err := versionTx(ctx, db, schema)
	return v, classify(err)
}

func versionTx(ctx context.Context, db Querier, schema string) (int, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`,
		pgx.Identifier{schema, "arbor_migrations"}.Sanitize()).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read arbor version of schema %s: %w", schema, err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+
		pgx.Identifier{schema, "arbor_migrations"}.Sanitize()).Scan(&v); err != nil {
		return 0, fmt.Errorf("read arbor version of schema %s: %w", schema, err)
	}
	return v, nil
}

// ErrVersionMismatch is matched by every *VersionError.
var ErrVersionMismatch = errors.New("arbor schema version mismatch")

// VersionError says that a schema is not at the version this build expects.
type VersionError struct {
	Schema string
	Have   int // the schema's version (0: never migrated)
	Want   int // the version this build knows
}

func (e *VersionError) Error() string {
	switch {
	case e.Have == 0:
		return fmt.Sprintf("arbor schema %q is not migrated (version 0; this build needs version %d): run `arbor migrate up`", e.Schema, e.Want)
	case e.Have < e.Want:
		return fmt.Sprintf("arbor schema %q is at version %d; this build needs version %d: run `arbor migrate up`", e.Schema, e.Have, e.Want)
	default:
		return fmt.Sprintf("arbor schema %q is at version %d, newer than this build knows (version %d): upgrade arbor", e.Schema, e.Have, e.Want)
	}
}

func (e *VersionError) Is(target error) bool { return target == ErrVersionMismatch }

// Check returns a *VersionError unless schema is exactly at [Latest].
func Check(ctx context.Context, db Querier, schema string) error {
	v, err := versionTx(ctx, db, schema)
	if err != nil {
		return classify(err)
	}
	if v != Latest() {
		return &VersionError{Schema: schema, Have: v, Want: Latest()}
	}
	return nil
}
