package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/arborhq/arbor/migrations"
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
