package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/core"
)

// Budgets from the command line: set on the conversation and on a task,
// listed with their spend, shown by tree and show; bad input refused
// plainly.
func TestBudgetCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	require.Equal(t, "conversation "+b.conv+" has no budgets\n", b.arbor(t, "budget", b.conv).ok(t).stdout)
	require.Equal(t, "budget tokens of the conversation: 0/1000\n", b.arbor(t, "budget", b.conv, "tokens", "1000").ok(t).stdout)
	require.Equal(t, "budget tokens of task #1: 0/300 (park)\n",
		b.arbor(t, "budget", b.conv, "tokens", "300", "--task", "1", "--on-exhausted", "park").ok(t).stdout)

	run := b.start(t, 4) // ask_approval, under the turn #1
	_, err := b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token, Counter: "tokens", Amount: 120, Key: "k1", Spend: true})
	require.NoError(t, err)
	_, err = b.engine.C.ReserveBudget(b.ctx, core.ReserveParams{ConversationID: b.conv, TaskID: run.ID, Token: run.Token, Counter: "tokens", Amount: 30, Key: "k2"})
	require.NoError(t, err)

	out := b.arbor(t, "budget", b.conv).ok(t).stdout
	require.Equal(t, "budget tokens of the conversation: 120+30 held/1000\n"+
		"budget tokens of task #1: 120+30 held/300 (park)\n"+
		"spent tokens by task #4: 120+30 held\n", out)
	tree := b.arbor(t, "tree", "--no-age", b.conv).ok(t).stdout
	require.Contains(t, tree, "conversation "+b.conv+" budget tokens=120+30 held/1000\n")
	require.Contains(t, tree, "#1 chat_turn [waiting]")
	require.Contains(t, tree, "budget tokens=120+30 held/300 (park)")
	require.Contains(t, tree, "#4 ask_approval [running] attempt=0 spent tokens=120+30 held")
	require.Contains(t, b.arbor(t, "show", "1").ok(t).stdout, "budget tokens")
	require.Contains(t, b.arbor(t, "show", "4").ok(t).stdout, "spent tokens")

	b.arbor(t, "budget", b.conv, "tokens").fails(t, 1, "needs its maximum")
	b.arbor(t, "budget", b.conv, "tokens", "-4").fails(t, 1, "not a count")
	b.arbor(t, "budget", b.conv, "Bad Name", "4").fails(t, 1, "lower-case letters")
	b.arbor(t, "budget", b.conv, "tokens", "4", "--on-exhausted", "explode").fails(t, 1, "one of fail, park, return")
	b.arbor(t, "budget", b.conv, "tokens", "4", "--task", "999").fails(t, 1, "not found")
	b.arbor(t, "budget", b.conv+"-nope").fails(t, 1, "not found")
}

// A tenant's budgets from the command line: set (with a window), listed
// by tenant and with a conversation of the tenant; bad input refused.
func TestBudgetCommandTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.conv + "-tenant"
	require.Equal(t, "tenant \""+tenant+"\" has no budgets\n", b.arbor(t, "budget", "--tenant", tenant).ok(t).stdout)
	out := b.arbor(t, "budget", "--tenant", tenant, "tokens", "5000", "--window", "day", "--on-exhausted", "park").ok(t).stdout
	require.Regexp(t, `^budget tokens of tenant "`+tenant+`" per day from \d{4}-\d\d-\d\dT00:00Z: 0/5000 \(park\)\n$`, out)
	require.Equal(t, "budget calls of tenant \""+tenant+"\": 0/10\n", b.arbor(t, "budget", "--tenant", tenant, "calls", "10").ok(t).stdout)
	list := b.arbor(t, "budget", "--tenant", tenant).ok(t).stdout
	require.Contains(t, list, "budget calls of tenant \""+tenant+"\": 0/10\n")
	require.Contains(t, list, "budget tokens of tenant \""+tenant+"\" per day from ")

	_, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv + "-t", Kind: "turn", Tenant: tenant})
	require.NoError(t, err)
	require.Contains(t, b.arbor(t, "budget", b.conv+"-t").ok(t).stdout, "budget calls of tenant \""+tenant+"\": 0/10\n")

	b.arbor(t, "budget", "--tenant", tenant, "tokens", "5", "--window", "week").fails(t, 1, "not one of minute, hour, day")
	b.arbor(t, "budget", b.conv, "tokens", "5", "--window", "day").fails(t, 1, "--tenant")
	b.arbor(t, "budget", "--tenant", tenant, "wall_ms", "5").fails(t, 1, "no wall-time budget")
	b.arbor(t, "budget").fails(t, 1, "--tenant")
}
