package main

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/internal/testdb"
)

// TestDemoEndToEnd runs `arbor demo` as a user does: worker processes, a
// killed worker, recovery, and the invariant checker at the end.
func TestDemoEndToEnd(t *testing.T) {
	t.Parallel()
	_, schema := testdb.Fresh(t)
	res := runArbor(t, nil, "demo", "--database-url", testdb.URL(t), "--schema", schema).ok(t)
	out := res.stdout
	for _, want := range []string{
		"[worker-1] started",
		"rate_limited_api [sleeping] phase=backoff",
		"waits fail_fast on",
		"translate_fr [failed]",
		"translate_de [aborted]",
		"the abort settled 4 tasks, leaves first:",
		"[client] #",
		"awaits \"approval\"; the user approves it:",
		"delivered to #",
		"mail_agent [completed]",
		"interrupted by a new turn",
		"[client] turn #",
		"[worker-2] started",
		"invariant checker: no violations",
	} {
		require.Contains(t, out, want)
	}
	require.Regexp(t, regexp.MustCompile(`\[worker-2\] reconcile on open: conversation \S+: requeued \[\d+ \d+ \d+\]`), out)
	require.Regexp(t, regexp.MustCompile(`long_step \[completed\] attempt=1`), out, "the cut steps ran again after the crash")
	require.Regexp(t, regexp.MustCompile(`└── #\d+ chat_turn \[completed\] phase=working`), out)
}
