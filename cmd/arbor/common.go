package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/fsm"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// dbFlags are the flags every command shares.
type dbFlags struct {
	url    string
	direct string
	schema string
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "database-url", os.Getenv("ARBOR_DATABASE_URL"), "PostgreSQL URL (default $ARBOR_DATABASE_URL)")
	fs.StringVar(&f.direct, "direct-url", os.Getenv("ARBOR_DIRECT_URL"),
		"when --database-url goes through PgBouncer in transaction mode: a direct URL of the same database, for LISTEN and migrations (default $ARBOR_DIRECT_URL)")
	fs.StringVar(&f.schema, "schema", migrations.SchemaDefault, "schema arbor's tables live in")
}

// pools are a command's connections: main on --database-url, and direct on
// --direct-url when it was given (nil otherwise).
type pools struct {
	main, direct *pgxpool.Pool
}

// Close closes both.
func (p *pools) Close() {
	p.main.Close()
	if p.direct != nil {
		p.direct.Close()
	}
}

// unpooled is the pool for what needs one server session across
// transactions (the migrations' session advisory lock, LISTEN): the direct
// one when there is one.
func (p *pools) unpooled() *pgxpool.Pool {
	if p.direct != nil {
		return p.direct
	}
	return p.main
}

// config sets the engine configuration's pooler fields: with a direct URL,
// the database URL is taken for a transaction-mode pooler's.
func (p *pools) config(cfg *tasks.Config) *tasks.Config {
	if p.direct != nil {
		cfg.TransactionPooler, cfg.ListenPool = true, p.direct
	}
	return cfg
}

// connect opens the pools and checks that the database answers, with one
// clear line when it does not. Unless the URL chooses a
// default_query_exec_mode, statements go without pgx's prepared-statement
// cache, which a PgBouncer in transaction mode (before 1.21) breaks and a
// command that runs a few statements does not need.
func (f *dbFlags) connect(ctx context.Context) (*pools, error) {
	if f.url == "" {
		return nil, errors.New("no database: pass --database-url or set ARBOR_DATABASE_URL")
	}
	if err := migrations.ValidateSchema(f.schema); err != nil {
		return nil, err
	}
	main, err := openPool(ctx, f.url, "database URL")
	if err != nil {
		return nil, err
	}
	p := &pools{main: main}
	if f.direct != "" {
		if p.direct, err = openPool(ctx, f.direct, "direct URL"); err != nil {
			main.Close()
			return nil, err
		}
	}
	return p, nil
}

func openPool(ctx context.Context, url, what string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !strings.Contains(url, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach the database (%s): %w", what, err)
	}
	return pool, nil
}

// conn is an engine on pools of the command's own, closed by Close.
type conn struct {
	*tasks.Engine
	pools *pools
}

// Close closes the pools.
func (c *conn) Close() { c.pools.Close() }

// engine connects and opens an engine on the schema. A schema that is not
// at this build's version is reported by the migrations' own one-line
// message, which says what to run, without the engine's prefix. The caller
// closes it.
func (f *dbFlags) engine(ctx context.Context) (*conn, error) {
	p, err := f.connect(ctx)
	if err != nil {
		return nil, err
	}
	engine, err := tasks.New(ctx, p.main, p.config(&tasks.Config{Schema: f.schema}))
	if err != nil {
		p.Close()
		var ve *migrations.VersionError
		if errors.As(err, &ve) {
			return nil, ve
		}
		return nil, err
	}
	return &conn{Engine: engine, pools: p}, nil
}

func newFlagSet(name, help string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(printableWriter{stderr})
	fs.Usage = func() {
		fmt.Fprint(stderr, help)
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses flags wherever they stand among the positional arguments
// (`arbor tree c1 --json` and `arbor tree --json c1` mean the same), which
// the flag package alone does not: it stops at the first positional one.
// Everything after a lone "--" is positional, and so is a negative number
// such as "-1" that is not a flag's value (as in --limit -1): the flag
// package would read it as a flag named "1" and answer a mistyped task id
// with the whole usage. It returns the positional arguments and fails
// unless there are between least and most of them; what names them for the
// error.
func parseArgs(fs *flag.FlagSet, args []string, least, most int, what string) ([]string, error) {
	var flags, pos []string
args:
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			break args
		case len(a) < 2 || a[0] != '-' || isNegativeNumber(a):
			pos = append(pos, a)
		default:
			flags = append(flags, a)
			if takesValue(fs, a) && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		}
	}
	if err := parseFlags(fs, flags); err != nil {
		return nil, err
	}
	switch {
	case len(pos) < least:
		return nil, fmt.Errorf("%s: missing %s (see arbor %s --help)", fs.Name(), what, fs.Name())
	case len(pos) > most:
		return nil, fmt.Errorf("%s: unexpected argument %q (see arbor %s --help)", fs.Name(), pos[most], fs.Name())
	}
	return pos, nil
}

// parseFlags parses flags into fs. A mistake in them (a flag arbor does
// not know, a value that does not parse) is one line, naming the command
// and where its help is, like every other input error; only --help prints
// the help.
func parseFlags(fs *flag.FlagSet, flags []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(flags)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return fmt.Errorf("%s: %w (see arbor %s --help)", fs.Name(), err, fs.Name())
	}
	return nil
}

// isNegativeNumber says whether a is a minus sign and digits.
func isNegativeNumber(a string) bool {
	return len(a) > 1 && a[0] == '-' && strings.Trim(a[1:], "0123456789") == ""
}

// takesValue says whether the flag argument a (-name or --name) reads the
// next argument as its value, as the flag package does for every flag that
// is defined, is not boolean and has no "=value" of its own.
func takesValue(fs *flag.FlagSet, a string) bool {
	name := strings.TrimPrefix(a[1:], "-")
	if strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// parseTaskArg parses a command whose one positional argument is a task id.
func parseTaskArg(fs *flag.FlagSet, args []string) (int64, error) {
	pos, err := parseArgs(fs, args, 1, 1, "the task id")
	if err != nil {
		return 0, err
	}
	return parseTaskID(pos[0])
}

// parseTaskID reads a task id as the commands accept it: 42 or #42.
func parseTaskID(s string) (int64, error) {
	id, err := strconv.ParseInt(strings.TrimPrefix(s, "#"), 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%q is not a task id (a positive number, such as 42)", s)
	}
	return id, nil
}

// taskErr turns the engine's errors about one task into the line a user
// reads: an unknown task, and a status the operation does not apply to, are
// said plainly; anything else keeps the engine's text, which names the
// operation, the task and the cause.
func taskErr(op string, id int64, err error) error {
	var te *fsm.TransitionError
	switch {
	case errors.Is(err, arbortype.ErrNotFound):
		return fmt.Errorf("task %d not found", id)
	case errors.As(err, &te) && te.TaskID == id && opNeeds[op] != "":
		return fmt.Errorf("cannot %s task %d: it is %s (%s needs a task that is %s)", op, id, te.From, op, opNeeds[op])
	}
	return err
}

// opNeeds says which statuses each steering operation applies to.
var opNeeds = map[string]string{
	"abort":  "live",
	"cancel": "pending, running, waiting or sleeping",
	"wake":   "sleeping",
	"rerun":  "failed, aborted or cancelled",
}

// requireConversation fails unless the conversation exists: the engine
// reads an unknown conversation as one without tasks, which would draw an
// empty tree for a typo.
func requireConversation(ctx context.Context, e *conn, id string) (arbortype.Conversation, error) {
	c, err := e.Conversation(ctx, id)
	if errors.Is(err, arbortype.ErrNotFound) {
		return c, fmt.Errorf("conversation %q not found in schema %s", id, e.Config().Schema)
	}
	return c, err
}

// exitError carries an exit status other than 1.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// formatTime writes t in UTC to the second, or "-" for none. A year beyond
// 9999 keeps all its digits ("20000-01-01T00:00:00Z"), and one before 1 BC
// gets a minus sign, counted as astronomers do (44 BC is -0043): PostgreSQL
// stores years from 4713 BC to 294276 AD, and a row edited by hand may hold
// any of them.
func formatTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// age is how long before now t was, as humanDuration writes it (negative
// for a t after now). Two times more than 292 years apart do not fit in a
// Duration, and time.Time.Sub saturates; their age is counted in whole
// seconds instead, which an int64 holds for any two times PostgreSQL can
// store.
func age(now, t time.Time) string {
	if d := now.Sub(t); d != math.MinInt64 && d != math.MaxInt64 {
		return humanDuration(d)
	}
	s := now.Unix() - t.Unix()
	return humanSpan(s < 0, magnitude(s), 0)
}

// humanDuration writes d the way a person reads an age: 850ms, 12.3s, 4m05s,
// 3h02m, 2d04h, each unit truncated. A negative d gets a minus sign, unless
// it is under a millisecond, which is 0ms either way.
func humanDuration(d time.Duration) string {
	n := magnitude(int64(d))
	return humanSpan(d < 0, n/uint64(time.Second), n%uint64(time.Second))
}

// magnitude is |v| as an unsigned number, which exists for every int64:
// -math.MinInt64 overflows back to math.MinInt64, so negating the signed
// value, as humanDuration once did, can never reach a positive one.
func magnitude(v int64) uint64 {
	if v < 0 {
		return -uint64(v)
	}
	return uint64(v)
}

// humanSpan is humanDuration's writing of a span of secs seconds and nanos
// nanoseconds (below a second), negative if neg.
func humanSpan(neg bool, secs, nanos uint64) string {
	var s string
	switch {
	case secs == 0 && nanos < uint64(time.Millisecond):
		return "0ms"
	case secs == 0:
		s = fmt.Sprintf("%dms", nanos/uint64(time.Millisecond))
	case secs < 60:
		s = fmt.Sprintf("%d.%ds", secs, nanos/uint64(100*time.Millisecond))
	case secs < 3600:
		s = fmt.Sprintf("%dm%02ds", secs/60, secs%60)
	case secs < 24*3600:
		s = fmt.Sprintf("%dh%02dm", secs/3600, secs/60%60)
	default:
		s = fmt.Sprintf("%dd%02dh", secs/(24*3600), secs/3600%24)
	}
	if neg {
		return "-" + s
	}
	return s
}
