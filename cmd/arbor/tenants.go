package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
)

const tenantsHelp = `Usage: arbor tenants [set TENANT WEIGHT] [flags]

With no argument, lists the tenants given a weight in the fair claim, by
name, with their weight ("-" names the default tenant, ""). A tenant never
given one weighs 1 and is not listed.

"set TENANT WEIGHT" sets a tenant's weight, 1 to 1000: under contention
every runner shares its workers among the tenants with runnable work by
weight (docs/design.md §3.15). Give "" for the default tenant.

Example:
  arbor tenants
  arbor tenants set acme 5
  arbor tenants --json
`

type tenantJSON struct {
	Tenant    string   `json:"tenant"`
	Weight    int      `json:"weight"`
	UpdatedAt jsonTime `json:"updated_at"`
}

func cmdTenants(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tenants", tenantsHelp, stderr)
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseArgs(fs, args, 0, 3, "")
	if err != nil {
		return err
	}
	var weight int
	switch {
	case len(pos) == 0:
	case pos[0] != "set":
		return fmt.Errorf("tenants: unknown subcommand %q (set TENANT WEIGHT, or none to list)", pos[0])
	case len(pos) != 3:
		return fmt.Errorf("tenants: set needs a tenant and its weight (see arbor tenants --help)")
	default:
		if weight, err = strconv.Atoi(pos[2]); err != nil {
			return fmt.Errorf("tenants: weight %q is not a number from 1 to 1000", pos[2])
		}
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	if len(pos) == 3 {
		if err := engine.SetTenantWeight(ctx, pos[1], weight); err != nil {
			return fmt.Errorf("tenants: %w", err)
		}
		fmt.Fprintf(stdout, "tenant %s weighs %d\n", tenantName(pos[1]), weight)
		return nil
	}
	all, err := engine.Tenants(ctx)
	if err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	if *asJSON {
		out := make([]tenantJSON, 0, len(all))
		for _, t := range all {
			out = append(out, tenantJSON{Tenant: t.Name, Weight: t.Weight, UpdatedAt: jsonTime(t.UpdatedAt)})
		}
		return writeJSON(stdout, out, false)
	}
	if len(all) == 0 {
		fmt.Fprintln(stdout, "no tenant has a weight: every tenant weighs 1")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tWEIGHT\tUPDATED")
	for _, t := range all {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", tenantName(t.Name), t.Weight, formatTime(&t.UpdatedAt))
	}
	return tw.Flush()
}

// tenantName is a tenant as the commands print it: escaped, and "-" for
// the default tenant ("").
func tenantName(t string) string { return orDash(printable(t)) }

const limitsHelp = `Usage: arbor limits [set KEY MAX | rm KEY] [flags]

With no argument, lists the concurrency limits by key, each with how many
runs hold a slot of it now and its maximum; "(full)" marks a limit whose
runs reached it (its key's pending tasks wait for a slot).

"set KEY MAX" bounds how many tasks of KEY run at once across every node:
KEY is tenant:<tenant>, kind:<kind> or key:<key> (the tasks created with
that concurrency key: a tool, a model provider). A new limit counts the
runs of its key already under way; lowering one stops nothing that runs.
"rm KEY" removes a limit (docs/design.md §3.15).

Example:
  arbor limits
  arbor limits set tenant:acme 20
  arbor limits set key:openai 8
  arbor limits rm kind:browse
`

type limitJSON struct {
	Key       string   `json:"key"`
	Running   int      `json:"running"`
	Max       int      `json:"max"`
	UpdatedAt jsonTime `json:"updated_at"`
}

func cmdLimits(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("limits", limitsHelp, stderr)
	var db dbFlags
	db.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseArgs(fs, args, 0, 3, "")
	if err != nil {
		return err
	}
	var max int
	switch {
	case len(pos) == 0:
	case pos[0] == "set" && len(pos) == 3:
		if max, err = strconv.Atoi(pos[2]); err != nil || max < 0 {
			return fmt.Errorf("limits: maximum %q is not a count ≥ 0", pos[2])
		}
	case pos[0] == "set":
		return fmt.Errorf("limits: set needs a key and its maximum (see arbor limits --help)")
	case pos[0] == "rm" && len(pos) == 2:
	case pos[0] == "rm":
		return fmt.Errorf("limits: rm needs exactly one key (see arbor limits --help)")
	default:
		return fmt.Errorf("limits: unknown subcommand %q (set KEY MAX, rm KEY, or none to list)", pos[0])
	}
	engine, err := db.engine(ctx)
	if err != nil {
		return err
	}
	defer engine.Close()
	switch {
	case len(pos) == 3:
		if err := engine.SetConcurrencyLimit(ctx, pos[1], max); err != nil {
			return fmt.Errorf("limits: %w", err)
		}
		fmt.Fprintf(stdout, "limit %s: at most %d running\n", printable(pos[1]), max)
		return nil
	case len(pos) == 2:
		if err := engine.DeleteConcurrencyLimit(ctx, pos[1]); err != nil {
			return fmt.Errorf("limits: %w", err)
		}
		fmt.Fprintf(stdout, "limit %s removed\n", printable(pos[1]))
		return nil
	}
	all, err := engine.ConcurrencyLimits(ctx)
	if err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if *asJSON {
		out := make([]limitJSON, 0, len(all))
		for _, l := range all {
			out = append(out, limitJSON{Key: l.Key, Running: l.Running, Max: l.Max, UpdatedAt: jsonTime(l.UpdatedAt)})
		}
		return writeJSON(stdout, out, false)
	}
	if len(all) == 0 {
		fmt.Fprintln(stdout, "no concurrency limits")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tRUNNING/MAX\tUPDATED")
	for _, l := range all {
		full := ""
		if l.Running >= l.Max {
			full = " (full)"
		}
		fmt.Fprintf(tw, "%s\t%d/%d%s\t%s\n", printable(l.Key), l.Running, l.Max, full, formatTime(&l.UpdatedAt))
	}
	return tw.Flush()
}
