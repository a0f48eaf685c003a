package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

const lsHelp = `Usage: arbor ls [flags]

Lists the conversations that have live work (a task pending, running,
waiting, sleeping or completing), in id order: how many live tasks each has
by status, the machine holding it (its lease owner) and that lease's
deadline. When a conversation listed belongs to a tenant other than the
default one, a TENANT column names each one's ("-" for the default).
--status keeps the conversations with a live task in one of the statuses
given (comma-separated); the counts still cover every live status.

Example:
  arbor ls
  arbor ls --status running,completing
  arbor ls --json --limit 0
`

type lsEntry struct {
	ID string `json:"id"`
	// Tenant is the conversation's tenant; "" the default one.
	Tenant         string         `json:"tenant"`
	Holder         string         `json:"holder"`
	Epoch          int64          `json:"epoch"`
	LeaseExpiresAt *jsonTime      `json:"lease_expires_at,omitempty"`
	Live           map[string]int `json:"live"`
	// Awaiting is how many of the sleeping tasks are parked in an await.
	Awaiting int `json:"awaiting"`
}

func cmdLs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ls", lsHelp, stderr)
	var db dbFlags
	db.register(fs)
	statusFlag := fs.String("status", "", "only conversations with a live task in one of these statuses (comma-separated)")
	limit := fs.Int("limit", 1000, "list at most this many conversations (0: all)")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := parseArgs(fs, args, 0, 0, ""); err != nil {
		return err
	}
	if *limit < 0 {
		return fmt.Errorf("ls: --limit %d is negative", *limit)
	}
	var statuses []arbortype.Status
	if *statusFlag != "" {
		for _, s := range strings.Split(*statusFlag, ",") {
			st := arbortype.Status(strings.TrimSpace(s))
			if !st.Live() {
				return fmt.Errorf("ls: --status %q: give live statuses: pending, running, waiting, sleeping, completing", s)
			}
			statuses = append(statuses, st)
		}
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	// One more than asked, to say whether the list was cut.
	query := *limit
	if query > 0 {
		query++
	}
	convs, err := engine.ListConversations(ctx, tasks.ListParams{Statuses: statuses, Limit: query})
	if err != nil {
		return fmt.Errorf("list conversations: %w", err)
	}
	cut := *limit > 0 && len(convs) > *limit
	if cut {
		convs = convs[:*limit]
	}

	if *asJSON {
		out := make([]lsEntry, 0, len(convs))
		for _, c := range convs {
			e := lsEntry{ID: c.ID, Tenant: c.Tenant, Holder: c.Holder, Epoch: c.Epoch, LeaseExpiresAt: (*jsonTime)(c.LeaseExpiresAt), Live: map[string]int{}, Awaiting: c.Awaiting}
			for st, n := range c.Live {
				e.Live[string(st)] = n
			}
			out = append(out, e)
		}
		return writeJSON(stdout, out, false)
	}
	if len(convs) == 0 {
		fmt.Fprintln(stdout, "no conversation has live work")
		return nil
	}
	live := []arbortype.Status{arbortype.StatusPending, arbortype.StatusRunning, arbortype.StatusWaiting, arbortype.StatusSleeping, arbortype.StatusCompleting}
	// The TENANT column is there when a conversation listed is not of the
	// default tenant: with one tenant, the listing is as it always was.
	tenants := false
	for _, c := range convs {
		tenants = tenants || c.Tenant != ""
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "CONVERSATION")
	if tenants {
		fmt.Fprint(tw, "\tTENANT")
	}
	fmt.Fprint(tw, "\tLIVE")
	for _, st := range live {
		fmt.Fprintf(tw, "\t%s", strings.ToUpper(string(st)))
		if st == arbortype.StatusSleeping {
			fmt.Fprint(tw, "\tAWAITING")
		}
	}
	fmt.Fprint(tw, "\tHOLDER\tLEASE DEADLINE\n")
	now := time.Now()
	for _, c := range convs {
		total := 0
		for _, n := range c.Live {
			total += n
		}
		fmt.Fprint(tw, printable(c.ID))
		if tenants {
			fmt.Fprintf(tw, "\t%s", orDash(printable(c.Tenant)))
		}
		fmt.Fprintf(tw, "\t%d", total)
		for _, st := range live {
			if st == arbortype.StatusSleeping {
				// An await is stored as a sleep: counted apart.
				fmt.Fprintf(tw, "\t%d\t%d", c.Live[st]-c.Awaiting, c.Awaiting)
				continue
			}
			fmt.Fprintf(tw, "\t%d", c.Live[st])
		}
		holder, deadline := "-", "-"
		if c.Holder != "" {
			holder = printable(c.Holder)
		}
		if c.LeaseExpiresAt != nil {
			deadline = formatTime(c.LeaseExpiresAt)
			if c.LeaseExpiresAt.Before(now) {
				deadline += " (expired)"
			}
		}
		fmt.Fprintf(tw, "\t%s\t%s\n", holder, deadline)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if cut {
		fmt.Fprintf(stdout, "(only the first %d; raise --limit, or 0 for all)\n", *limit)
	}
	return nil
}
