package main

import (
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// A conversation of a tenant, and a task with a priority, a concurrency
// key and a time to live in the queue: ls, tree and show print them
// (escaped), and leave them out where they are the defaults.
func TestTenantFieldsShown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.conv = "conv-a"
	b.create(t, 0, "turn", false)
	b.conv = "conv-t"
	hostile := "acme\x1b[2J\u202e"
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "turn", Tenant: hostile,
		Priority: 60, ConcurrencyKey: "openai\nforged", QueueTTL: time.Hour})
	require.NoError(t, err)
	require.NotNil(t, task.QueueExpiresAt)

	require.Equal(t, `CONVERSATION  TENANT             LIVE  PENDING  RUNNING  WAITING  SLEEPING  AWAITING  COMPLETING  HOLDER  LEASE DEADLINE
conv-a        -                  1     1        0        0        0         0         0           -       -
conv-t        acme\x1b[2J\u202e  1     1        0        0        0         0         0           -       -
`, b.arbor(t, "ls").ok(t).stdout)
	var entries []struct {
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "ls", "--json").ok(t).stdout), &entries))
	require.Equal(t, "", entries[0].Tenant)
	require.Equal(t, hostile, entries[1].Tenant)

	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	tree := stamp.ReplaceAllString(b.arbor(t, "tree", "--no-age", "conv-t").ok(t).stdout, "TIME")
	require.Equal(t, `conversation conv-t tenant=acme\x1b[2J\u202e
└── #2 turn [pending] attempt=0 priority=60 key=openai\nforged expires at TIME
`, tree)
	require.Equal(t, "conversation conv-a\n└── #1 turn [pending] attempt=0\n", b.arbor(t, "tree", "--no-age", "conv-a").ok(t).stdout)

	show := stamp.ReplaceAllString(b.arbor(t, "show", "2").ok(t).stdout, "TIME")
	require.Contains(t, show, "tenant              acme\\x1b[2J\\u202e\n")
	require.Contains(t, show, "priority            60\n")
	require.Contains(t, show, "concurrency key     openai\\nforged\n")
	require.Contains(t, show, "queue expires       TIME\n")
	require.NotContains(t, show, "\x1b")
	plainShow := b.arbor(t, "show", "1").ok(t).stdout
	for _, field := range []string{"tenant", "priority", "concurrency key", "queue expires"} {
		require.NotContains(t, plainShow, "\n"+field+" ")
	}
	var doc struct {
		Task struct {
			Tenant         string  `json:"tenant"`
			Priority       int     `json:"priority"`
			ConcurrencyKey string  `json:"concurrency_key"`
			QueueExpiresAt *string `json:"queue_expires_at"`
		} `json:"task"`
		Conversation struct {
			Tenant string `json:"tenant"`
		} `json:"conversation"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "show", "2", "--json").ok(t).stdout), &doc))
	require.Equal(t, hostile, doc.Task.Tenant)
	require.Equal(t, hostile, doc.Conversation.Tenant)
	require.Equal(t, 60, doc.Task.Priority)
	require.Equal(t, "openai\nforged", doc.Task.ConcurrencyKey)
	require.NotNil(t, doc.Task.QueueExpiresAt)
}

// arbor tenants lists and sets the weights; bad input is one line and
// writes nothing.
func TestTenantsCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "no tenant has a weight: every tenant weighs 1\n", b.arbor(t, "tenants").ok(t).stdout)
	require.Equal(t, "tenant acme weighs 5\n", b.arbor(t, "tenants", "set", "acme", "5").ok(t).stdout)
	require.Equal(t, "tenant - weighs 2\n", b.arbor(t, "tenants", "set", "", "2").ok(t).stdout)
	require.Equal(t, "tenant evil\\x1b]0;x\\a weighs 1\n", b.arbor(t, "tenants", "set", "evil\x1b]0;x\x07", "1").ok(t).stdout)
	require.Equal(t, "tenant acme weighs 7\n", b.arbor(t, "tenants", "set", "acme", "7").ok(t).stdout)

	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	require.Equal(t, `TENANT          WEIGHT  UPDATED
-               2       TIME
acme            7       TIME
evil\x1b]0;x\a  1       TIME
`, stamp.ReplaceAllString(b.arbor(t, "tenants").ok(t).stdout, "TIME"))
	var list []struct {
		Tenant string `json:"tenant"`
		Weight int    `json:"weight"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "tenants", "--json").ok(t).stdout), &list))
	require.Len(t, list, 3)
	require.Equal(t, "acme", list[1].Tenant)
	require.Equal(t, 7, list[1].Weight)

	b.arbor(t, "tenants", "set", "acme", "0").fails(t, 1, "outside 1..1000")
	b.arbor(t, "tenants", "set", "acme", "1001").fails(t, 1, "outside 1..1000")
	b.arbor(t, "tenants", "set", "acme", "heavy").fails(t, 1, `weight "heavy" is not a number`)
	b.arbor(t, "tenants", "set", "acme").fails(t, 1, "set needs a tenant and its weight")
	b.arbor(t, "tenants", "drop", "acme").fails(t, 1, `unknown subcommand "drop"`)
	all, err := b.engine.Tenants(b.ctx)
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.Equal(t, 7, all[1].Weight, "a refused weight wrote nothing")
}

// arbor limits lists the limits with their running counts, sets and
// removes them; bad input is one line and writes nothing.
func TestLimitsCommand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Equal(t, "no concurrency limits\n", b.arbor(t, "limits").ok(t).stdout)
	// A run under way of kind browse: a new limit of its kind counts it.
	b.start(t, b.create(t, 0, "browse", false).ID)
	require.Equal(t, "limit kind:browse: at most 1 running\n", b.arbor(t, "limits", "set", "kind:browse", "1").ok(t).stdout)
	require.Equal(t, "limit key:openai: at most 8 running\n", b.arbor(t, "limits", "set", "key:openai", "8").ok(t).stdout)
	require.Equal(t, "limit tenant:a\\nb: at most 3 running\n", b.arbor(t, "limits", "set", "tenant:a\nb", "3").ok(t).stdout)

	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	require.Equal(t, `KEY          RUNNING/MAX  UPDATED
key:openai   0/8          TIME
kind:browse  1/1 (full)   TIME
tenant:a\nb  0/3          TIME
`, stamp.ReplaceAllString(b.arbor(t, "limits").ok(t).stdout, "TIME"))
	var list []struct {
		Key     string `json:"key"`
		Running int    `json:"running"`
		Max     int    `json:"max"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "limits", "--json").ok(t).stdout), &list))
	require.Len(t, list, 3)
	require.Equal(t, "kind:browse", list[1].Key)
	require.Equal(t, 1, list[1].Running)
	require.Equal(t, 1, list[1].Max)

	require.Equal(t, "limit key:openai removed\n", b.arbor(t, "limits", "rm", "key:openai").ok(t).stdout)
	b.arbor(t, "limits", "rm", "key:openai").fails(t, 1, "not found")
	b.arbor(t, "limits", "set", "model:x", "3").fails(t, 1, "not tenant:<tenant>, kind:<kind> or key:<key>")
	b.arbor(t, "limits", "set", "key:x", "-3").fails(t, 1, `maximum "-3" is not a count`)
	b.arbor(t, "limits", "set", "key:x").fails(t, 1, "set needs a key and its maximum")
	b.arbor(t, "limits", "rm").fails(t, 1, "rm needs exactly one key")
	b.arbor(t, "limits", "drop", "key:x").fails(t, 1, `unknown subcommand "drop"`)
	all, err := b.engine.ConcurrencyLimits(b.ctx)
	require.NoError(t, err)
	require.Len(t, all, 2, "a refused limit wrote nothing")
}
