package main

import (
	"bufio"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestCommandsThroughPgBouncer runs the commands with --database-url
// through PgBouncer in transaction mode: they work without a word of
// configuration (the CLI does not use pgx's prepared-statement cache),
// migrate runs on --direct-url (its advisory lock needs one session), and
// log --follow, LISTENing on --direct-url, prints a new entry.
func TestCommandsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := testdb.PgBouncerURL(t)
	b := setup(t)
	through := func(args ...string) result {
		t.Helper()
		return runArbor(t, nil, append(args, "--database-url", bouncer, "--schema", b.schema)...)
	}
	withDirect := func(args ...string) result {
		t.Helper()
		return runArbor(t, nil, append(args, "--database-url", bouncer, "--direct-url", testdb.URL(t), "--schema", b.schema)...)
	}
	root := b.create(t, 0, "turn", false)
	child := b.create(t, root.ID, "tool", false)

	require.Contains(t, withDirect("migrate", "up").ok(t).stdout, "applied []")
	require.Contains(t, through("ls").ok(t).stdout, b.conv)
	require.Contains(t, through("tree", b.conv).ok(t).stdout, "tool")
	require.Contains(t, through("show", strconv.FormatInt(child.ID, 10)).ok(t).stdout, "tool")
	through("emit", b.conv, "note", `{"n": 1}`).ok(t)
	require.Contains(t, through("log", b.conv).ok(t).stdout, "note")
	through("check", b.conv).ok(t)

	// Follow from now on, then emit: the follower prints it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	follow := exec.CommandContext(ctx, arborBin, "log", b.conv, "--follow",
		"--database-url", bouncer, "--direct-url", testdb.URL(t), "--schema", b.schema)
	follow.Env = environWithout("ARBOR_DATABASE_URL")
	out, err := follow.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, follow.Start())
	t.Cleanup(func() {
		cancel()
		_ = follow.Wait()
	})
	lines := bufio.NewScanner(out)
	// The follower prints the log so far first: the note above.
	for lines.Scan() && !strings.Contains(lines.Text(), "note") {
	}
	through("emit", b.conv, "second-note", `{"n": 2}`).ok(t)
	heard := false
	for lines.Scan() {
		if strings.Contains(lines.Text(), "second-note") {
			heard = true
			break
		}
	}
	require.True(t, heard, "log --follow printed the new entry")

	through("abort", strconv.FormatInt(root.ID, 10)).ok(t)
	through("check", b.conv).ok(t)
}
