// Command arbor migrates, inspects and steers arbor's task trees from a
// terminal, and runs the demo.
//
//	arbor migrate up|down TARGET|version|print [--down] VERSION
//	arbor ls [--status S]
//	arbor tree CONVERSATION [--json] [--watch]
//	arbor show TASK [--json]
//	arbor abort TASK | cancel TASK | wake TASK | rerun TASK
//	arbor emit CONVERSATION NAME [PAYLOAD] | pending | events | log | budget CONVERSATION [COUNTER MAX]
//	arbor tenants [set TENANT WEIGHT] | limits [set KEY MAX | rm KEY]
//	arbor check [CONVERSATION]
//	arbor schedule add NAME --kind K (--cron EXPR | --every DUR) | ls | pause NAME | resume NAME | rm NAME
//	arbor ui [--addr A] [--actions] [--demo]
//	arbor demo
//
// The database URL comes from --database-url or ARBOR_DATABASE_URL, the
// schema from --schema (default "arbor"). Every command prints its help and
// an example with --help. Errors are one line on stderr and a non-zero exit
// status; check exits 1 when it finds violations and 2 when it cannot check.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runMain runs the command and turns its outcome into an exit status, with
// any error as one line on stderr. A panic is a bug of arbor's: it is
// reported in one line too (the stack only with ARBOR_DEBUG=1), never as a
// crash dump in the operator's terminal.
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "arbor: internal error (a bug, please report it): %s\n", printable(fmt.Sprint(r)))
			if os.Getenv("ARBOR_DEBUG") == "1" {
				stderr.Write(debug.Stack())
			}
			code = 2
		}
	}()
	err := run(ctx, args, stdout, stderr)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	}
	// pgx joins the errors of several connection attempts with newlines.
	// Errors echo data (a conversation id, a server's message): what is
	// left unprintable is escaped.
	msg := printable(strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " "))
	fmt.Fprintln(stderr, "arbor:", msg)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}

const usage = `arbor keeps the task trees of conversations in PostgreSQL.

Usage:
  arbor migrate up|down TARGET|version   apply or revert arbor's (and River's) migrations
  arbor migrate print [--down] VERSION   print the SQL of arbor's migration VERSION
  arbor ls [--status S]                  conversations with live work, their holder and lease
  arbor tree CONVERSATION                a conversation's task tree (--json, --watch)
  arbor show TASK                        everything about one task (--json)
  arbor abort TASK                       abort a task and its subtree, leaves first (--conversation, --reason)
  arbor cancel TASK                      cancel a task (its children are aborted)
  arbor wake TASK                        wake a sleeping task now
  arbor rerun TASK                       run a failed, aborted or cancelled task again from its checkpoint
  arbor emit CONVERSATION NAME [PAYLOAD] emit an event (--task ID, --token T for an approval)
  arbor pending CONVERSATION             what the conversation awaits, with the tokens that answer it
  arbor events CONVERSATION              the conversation's events and what became of each (--json)
  arbor budget CONVERSATION [COUNTER MAX] list a conversation's budgets, or set one (--task, --on-exhausted)
  arbor log CONVERSATION                 the conversation's log (--follow)
  arbor tenants [set TENANT WEIGHT]      the tenants' weights in the fair claim, or set one
  arbor limits [set KEY MAX | rm KEY]    the concurrency limits (running/max), or set or remove one
  arbor check [CONVERSATION]             run the invariant checker (exit 1 on violations)
  arbor ui                               serve the web view (--addr, --actions, --demo)
  arbor prune --older-than D             delete settled history older than D (--dry-run)
  arbor fork CONVERSATION TURN           copy the history through a turn into a new conversation
  arbor schedule add|ls|pause|resume|rm  turns started at cron times or every interval (--kind, --cron, --every)
  arbor demo                             run the end-to-end demo
  arbor demo-worker --node NAME          the demo's worker process (arbor demo starts it)

Every command takes --database-url (default $ARBOR_DATABASE_URL) and
--schema (default "arbor"). Through PgBouncer in transaction mode, add
--direct-url (default $ARBOR_DIRECT_URL), a direct URL of the same database,
on which migrate runs and log --follow and the demo LISTEN (docs/scaling.md).
Run "arbor COMMAND --help" for its flags and an example.
`

type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

var commands = map[string]command{
	"migrate": cmdMigrate,
	"ls":      cmdLs,
	"tree":    cmdTree,
	"show":    cmdShow,
	"abort":   cmdAbort,
	"cancel":  cmdCancel,
	"wake":    cmdWake,
	"rerun":   cmdRerun,
	"emit":    cmdEmit,
	"budget":  cmdBudget,
	"pending": cmdPending,
	"events":  cmdEvents,
	"log":     cmdLog,
	"tenants": cmdTenants,
	"limits":  cmdLimits,
	"check":   cmdCheck,
	"ui":      cmdUI,
	"prune":   cmdPrune,
	"fork":    cmdFork,
	"demo":    cmdDemo,
	// schedule manages the schedules (docs/agents.md, "Schedules").
	"schedule": cmdSchedule,
	// demo-worker is the runner process the demo starts (and kills).
	"demo-worker": cmdDemoWorker,
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if cmd, ok := commands[args[1]]; ok {
				return cmd(ctx, []string{"--help"}, stdout, stderr)
			}
			return fmt.Errorf("help: unknown command %q (run arbor help)", args[1])
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	if cmd, ok := commands[args[0]]; ok {
		return cmd(ctx, args[1:], stdout, stderr)
	}
	return fmt.Errorf("unknown command %q (run arbor help for the list)", args[0])
}
