package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/migrations"
	"github.com/arborhq/arbor/tasks"
)

// dbFlags are the flags every command shares.
type dbFlags struct {
	url    string
	schema string
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "database-url", os.Getenv("ARBOR_DATABASE_URL"), "PostgreSQL URL (default $ARBOR_DATABASE_URL)")
	fs.StringVar(&f.schema, "schema", migrations.SchemaDefault, "schema arbor's tables live in")
}

// connect opens a pool and checks that the database answers, with one clear
// line when it does not.
func (f *dbFlags) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if f.url == "" {
		return nil, errors.New("no database: pass --database-url or set ARBOR_DATABASE_URL")
	}
	if err := migrations.ValidateSchema(f.schema); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, f.url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach the database: %w", err)
	}
	return pool, nil
}

// conn is an engine on a pool of the command's own, closed by Close.
type conn struct {
	*tasks.Engine
	pool *pgxpool.Pool
}

// Close closes the pool.
func (c *conn) Close() { c.pool.Close() }

// engine connects and opens an engine on the schema. A schema that is not
// at this build's version is reported by the migrations' own one-line
// message, which says what to run, without the engine's prefix. The caller
// closes it.
func (f *dbFlags) engine(ctx context.Context) (*conn, error) {
	pool, err := f.connect(ctx)
	if err != nil {
		return nil, err
	}
	engine, err := tasks.New(ctx, pool, &tasks.Config{Schema: f.schema})
	if err != nil {
		pool.Close()
		var ve *migrations.VersionError
		if errors.As(err, &ve) {
			return nil, ve
		}
		return nil, err
	}
	return &conn{Engine: engine, pool: pool}, nil
}

func newFlagSet(name, help string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
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
// Everything after a lone "--" is positional. It returns the positional
// arguments and fails unless there are between least and most of them; what
// names them for the error.
func parseArgs(fs *flag.FlagSet, args []string, least, most int, what string) ([]string, error) {
	var tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	pos = append(pos, tail...)
	switch {
	case len(pos) < least:
		return nil, fmt.Errorf("%s: missing %s (see arbor %s --help)", fs.Name(), what, fs.Name())
	case len(pos) > most:
		return nil, fmt.Errorf("%s: unexpected argument %q (see arbor %s --help)", fs.Name(), pos[most], fs.Name())
	}
	return pos, nil
}

// parseTaskID reads a task id as the commands accept it: 42 or #42.
// parseTaskArg parses a command whose one positional argument is a task id.
func parseTaskArg(fs *flag.FlagSet, args []string) (int64, error) {
	pos, err := parseArgs(fs, args, 1, 1, "the task id")
	if err != nil {
		return 0, err
	}
	return parseTaskID(pos[0])
}

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
	var te *tasks.TransitionError
	switch {
	case errors.Is(err, tasks.ErrNotFound):
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
}

// requireConversation fails unless the conversation exists: the engine
// reads an unknown conversation as one without tasks, which would draw an
// empty tree for a typo.
func requireConversation(ctx context.Context, e *conn, id string) (arbortype.Conversation, error) {
	c, err := e.Conversation(ctx, id)
	if errors.Is(err, tasks.ErrNotFound) {
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

// formatTime writes t in UTC to the second, or "-" for none.
func formatTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// humanDuration writes d the way a person reads an age: 850ms, 12.3s, 4m05s,
// 3h02m, 2d04h.
func humanDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + humanDuration(-d)
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}
