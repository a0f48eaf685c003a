package machine_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/tasks"
)

// A run whose ending write makes its own task runnable at once — an await
// whose event was emitted before it parked — is claimed again in the flush
// that applies that write, before the first run's handler has returned.
// Once both runs are over the runner must count the conversation idle and
// release it after IdleRelease. The soak (issue 14) found every such
// conversation held for ever: the second run's dispatch replaced the first
// in the runner's table, the first run's end then removed the second's
// entry, and the conversation's count of running handlers never fell back
// to zero, so neither IdleRelease nor a full node let it go.
func TestRunnerReleasesAConversationWhoseTaskWasClaimedAgainInItsOwnFlush(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan delivery, 1)
	task, _, err := b.engine.Create(b.ctx, arbortype.CreateParams{ConversationID: b.conv, Kind: "approval"})
	require.NoError(t, err)
	_, _, err = b.engine.Emit(b.ctx, tasks.EmitParams{ConversationID: b.conv, TaskID: task.ID, Name: "approve", Payload: json.RawMessage(`true`)})
	require.NoError(t, err)
	r := fastRunner(t, b, awaitHandlers(0, nil, got), nil)
	d := <-got
	require.Equal(t, task.ID, d.task)
	waitUntil(t, "the task to complete", func() bool { return b.status(t, task.ID) == arbortype.StatusCompleted })
	waitUntil(t, "the idle conversation to be released", func() bool { return len(r.Held()) == 0 })
	b.requireClean(t)
}
