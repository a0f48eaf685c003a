package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

func TestShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleTree(t)
	summary := b.get(t, 5)

	// Timestamps vary; everything else is exact.
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	out := stamp.ReplaceAllString(b.arbor(t, "show", "1").ok(t).stdout, "TIME")
	require.Equal(t, fmt.Sprintf(`task #1 chat_turn
conversation        %s
owner               none (a root task)
status              waiting
background          no
phase               gathering
attempt             0 of restart_limit 5
retries             0 of max_retries 0
abandon_on_restart  no
wait                all_settled on #2 #3 #4
wake at             -
run                 none (not running)
holder              test (epoch 1, lease until TIME, held)
idempotency key     -
created             TIME
started             TIME
updated             TIME
settled             -
input:
  {
    "kind": "chat_turn"
  }
state:
  {
    "waiting_for": 3
  }
result: -
error: -
children (4):
  #2 search_web [completed]
  #3 read_docs [failed]
  #4 ask_approval [pending]
  #5 summarize_history [running] (background)
`, b.conv), out)

	out = stamp.ReplaceAllString(b.arbor(t, "show", "5").ok(t).stdout, "TIME")
	require.Contains(t, out, "owner               #1 chat_turn [waiting]\n")
	require.Contains(t, out, "background          yes\n")
	require.Contains(t, out, fmt.Sprintf("run                 token %d, lease deadline TIME\n", summary.Token))
	require.Contains(t, out, "children: none\n")

	out = b.arbor(t, "show", "3").ok(t).stdout
	require.Contains(t, out, "error:\n  message: docs server returned 503\n")

	var doc struct {
		Task struct {
			ID      int64  `json:"id"`
			Status  string `json:"status"`
			Token   int64  `json:"token"`
			OwnerID int64  `json:"owner_id"`
		} `json:"task"`
		Owner *struct {
			ID int64 `json:"id"`
		} `json:"owner"`
		Children []struct {
			ID      int64 `json:"id"`
			OwnerID int64 `json:"owner_id"`
		} `json:"children"`
		Conversation struct {
			ID     string `json:"id"`
			Holder string `json:"holder"`
		} `json:"conversation"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "show", "7", "--json").ok(t).stdout), &doc))
	require.Equal(t, int64(7), doc.Task.ID)
	require.Equal(t, "completing", doc.Task.Status)
	require.Equal(t, int64(6), doc.Task.OwnerID)
	require.Len(t, doc.Children, 1)
	require.Equal(t, int64(8), doc.Children[0].ID)
	require.Equal(t, int64(7), doc.Children[0].OwnerID)
	require.Equal(t, int64(6), doc.Owner.ID)
	require.Equal(t, b.conv, doc.Conversation.ID)
	require.Equal(t, "test", doc.Conversation.Holder, "the test's lease")

	// A root has a null owner_id and no owner; a leaf an empty list of
	// children.
	var root struct {
		Task     map[string]json.RawMessage `json:"task"`
		Owner    json.RawMessage            `json:"owner"`
		Children []json.RawMessage          `json:"children"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.arbor(t, "show", "1", "--json").ok(t).stdout), &root))
	require.Equal(t, "null", string(root.Task["owner_id"]))
	require.Nil(t, root.Owner)
	require.Len(t, root.Children, 4)
	require.Contains(t, b.arbor(t, "show", "8", "--json").ok(t).stdout, "\n  \"children\": [],\n")
}

func TestShowErrorHistory(t *testing.T) {
	t.Parallel()
	s := setup(t)
	task, _, err := s.engine.Create(s.ctx, arbortype.CreateParams{ConversationID: s.conv, Kind: "flaky", MaxRetries: 1,
		RetryBackoffBase: time.Millisecond, RetryBackoffCap: time.Millisecond})
	require.NoError(t, err)
	run, err := s.engine.Start(s.ctx, task.ID)
	require.NoError(t, err)
	_, err = s.engine.Fail(s.ctx, run.ID, run.Token, arbortype.TaskError{Message: "first try broke"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		woken, err := s.engine.WakeSleeping(s.ctx, task.ID, 1)
		return err == nil && woken
	}, time.Minute, 5*time.Millisecond)
	run, err = s.engine.Start(s.ctx, task.ID)
	require.NoError(t, err)
	_, err = s.engine.Fail(s.ctx, run.ID, run.Token, arbortype.TaskError{Message: "second try broke"})
	require.NoError(t, err)
	out := s.arbor(t, "show", fmt.Sprint(task.ID)).ok(t).stdout
	require.Contains(t, out, "error history (2 tries):")
	require.Regexp(t, `try 1 at \S+: first try broke\n  try 2 at \S+: second try broke`, out)
}
