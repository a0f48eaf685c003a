package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Schedules from the command line: added, listed, paused, resumed,
// replaced and removed; bad input refused plainly, in one line.
func TestScheduleCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "no schedules\n", b.arbor(t, "schedule", "ls").ok(t).stdout)

	out := b.arbor(t, "schedule", "add", "nightly", "--kind", "digest", "--cron", "0 2 * * *", "--tz", "Europe/Paris",
		"--missed", "run_once", "--tenant", "acme", "--input", `{"since":"24h"}`).ok(t).stdout
	require.True(t, strings.HasPrefix(out, `schedule nightly cron="0 2 * * *" tz=Europe/Paris kind=digest tenant=acme conversation=new-per-tick missed=run_once next=`), out)
	require.Contains(t, out, ":00:00Z\n")
	out = b.arbor(t, "schedule", "add", "poll", "--kind", "poll_inbox", "--every", "10m", "--conversation", "inbox").ok(t).stdout
	require.True(t, strings.HasPrefix(out, "schedule poll every=10m0s kind=poll_inbox conversation=inbox missed=skip next="), out)

	require.Contains(t, b.arbor(t, "schedule", "pause", "poll").ok(t).stdout, " paused next=")
	ls := b.arbor(t, "schedule", "ls").ok(t).stdout
	lines := strings.Split(strings.TrimSuffix(ls, "\n"), "\n")
	require.Len(t, lines, 2)
	require.True(t, strings.HasPrefix(lines[0], "schedule nightly "), ls)
	require.NotContains(t, lines[0], "paused")
	require.True(t, strings.HasPrefix(lines[1], "schedule poll "), ls)
	require.Contains(t, lines[1], " paused ")
	require.NotContains(t, b.arbor(t, "schedule", "resume", "poll").ok(t).stdout, "paused")

	// add replaces.
	require.Contains(t, b.arbor(t, "schedule", "add", "poll", "--kind", "poll_inbox", "--every", "5m").ok(t).stdout, "every=5m0s")
	require.Len(t, strings.Split(strings.TrimSuffix(b.arbor(t, "schedule", "ls").ok(t).stdout, "\n"), "\n"), 2)

	require.Equal(t, "schedule poll removed\n", b.arbor(t, "schedule", "rm", "poll").ok(t).stdout)
	b.arbor(t, "schedule", "rm", "poll").fails(t, 1, "not found")
	b.arbor(t, "schedule", "pause", "poll").fails(t, 1, "not found")
	b.arbor(t, "schedule", "resume", "poll").fails(t, 1, "not found")

	b.arbor(t, "schedule").fails(t, 1, "missing a subcommand")
	b.arbor(t, "schedule", "explode").fails(t, 1, "unknown subcommand")
	b.arbor(t, "schedule", "add").fails(t, 1, "missing the schedule's name")
	b.arbor(t, "schedule", "add", "x", "--cron", "* * * * *").fails(t, 1, "--kind is required")
	b.arbor(t, "schedule", "add", "x", "--kind", "k").fails(t, 1, "one of --cron and --every")
	b.arbor(t, "schedule", "add", "x", "--kind", "k", "--cron", "* * * * *", "--every", "1m").fails(t, 1, "one of --cron and --every")
	b.arbor(t, "schedule", "add", "x", "--kind", "k", "--cron", "0 25 * * *").fails(t, 1, "invalid argument")
	b.arbor(t, "schedule", "add", "x", "--kind", "k", "--every", "500ms").fails(t, 1, "at least a second")
	b.arbor(t, "schedule", "add", "x", "--kind", "k", "--every", "1m", "--missed", "twice").fails(t, 1, "missed policy")
	b.arbor(t, "schedule", "add", "x", "--kind", "k", "--cron", "* * * * *", "--tz", "Mars/Olympus").fails(t, 1, "time zone")
	b.arbor(t, "schedule", "add", "x", "--kind", "k", "--every", "1m", "--input", "{oops").fails(t, 1, "not valid JSON")
	// A hostile name is escaped, never written raw to the terminal.
	out = b.arbor(t, "schedule", "add", "evil\x1b[2J", "--kind", "k", "--every", "1m").ok(t).stdout
	require.NotContains(t, out, "\x1b")
	require.Len(t, strings.Split(strings.TrimSuffix(b.arbor(t, "schedule", "ls").ok(t).stdout, "\n"), "\n"), 2)
}
