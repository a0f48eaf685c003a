package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/arborhq/arbor/machine"
	"github.com/arborhq/arbor/reconcile"
	"github.com/arborhq/arbor/tasks"
)

const demoWorkerHelp = `Usage: arbor demo-worker --node NAME [flags]

The runner process that "arbor demo" starts, and kills: it runs the demo's
handlers until it is stopped (SIGINT, SIGTERM) or killed, and prints each
take-over's reconcile report.

Example:
  arbor demo-worker --node worker-1 --schema arbor
`

// demoLease is short so that the demo's crash is recovered quickly.
const demoLease = 2 * time.Second

func cmdDemoWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo-worker", demoWorkerHelp, stderr)
	var db dbFlags
	db.register(fs)
	node := fs.String("node", "", "the worker's node id")
	if _, err := parseArgs(fs, args, 0, 0, ""); err != nil {
		return err
	}
	if *node == "" {
		return fmt.Errorf("demo-worker: --node is required")
	}
	pools, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer pools.Close()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	engine, err := tasks.New(ctx, pools.main, pools.config(&tasks.Config{Schema: db.schema, TaskLease: demoLease, Logger: logger}))
	if err != nil {
		return err
	}
	runner, err := machine.NewRunner(engine, demoHandlers(), &machine.RunnerConfig{
		NodeID:            *node,
		ConversationLease: demoLease,
		PollInterval:      200 * time.Millisecond,
		IdleRelease:       time.Second,
		ShutdownGrace:     2 * time.Second,
		OnReconcile: func(rep reconcile.Report) {
			if !rep.Empty() {
				fmt.Fprintf(stdout, "reconcile on open: %s\n", rep)
			}
		},
	})
	if err != nil {
		return err
	}
	if err := runner.Start(ctx); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "started")
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return runner.Stop(stopCtx)
}
