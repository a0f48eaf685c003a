package machine

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/reconcile"
)

// A take-over logs one line at Info, with the sums of its conversations'
// reports; one that recovered nothing logs nothing.
func TestTakeOverLogsOneLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var none takeOver
	none.log(logger)
	require.Empty(t, buf.String())

	var took takeOver
	took.add(reconcile.Report{ConversationID: "a", Requeued: []int64{1, 2}, Restarted: []int64{1, 2}})
	took.add(reconcile.Report{ConversationID: "b", Requeued: []int64{3}, Abandoned: []int64{4}, WaitsWoken: []int64{5}})
	took.log(logger)
	out := buf.String()
	require.Equal(t, 1, strings.Count(out, "\n"), out)
	for _, want := range []string{`msg="arbor: took over conversations"`, "conversations=2", "requeued=3", "restarts_counted=2", "abandoned=1", "repaired=1"} {
		require.Contains(t, out, want)
	}
}
