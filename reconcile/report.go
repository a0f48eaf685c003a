package reconcile

import (
	"fmt"
	"log/slog"
)

// Report says what recovery did to a conversation, task by task.
type Report struct {
	ConversationID string
	// Requeued went from running back to pending.
	Requeued []int64
	// Restarted are those of Requeued whose recovery counted as a restart
	// (attempt + 1): their holder died or lost its lease while running them.
	Restarted []int64
	// Abandoned were abandon_on_restart tasks, settled cancelled.
	Abandoned []int64
	// LimitExceeded were failed with restart_limit_exceeded.
	LimitExceeded []int64
	// WaitsWoken were waiting tasks whose wait was found satisfied.
	WaitsWoken []int64
	// Completed were completing tasks whose children had all settled.
	Completed []int64
}

// Empty reports whether OnOpen found nothing to do.
func (r Report) Empty() bool {
	return len(r.Requeued)+len(r.Abandoned)+len(r.LimitExceeded)+len(r.WaitsWoken)+len(r.Completed) == 0
}

// LogValue makes a Report a structured slog value: the count per outcome.
func (r Report) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("conversation_id", r.ConversationID),
		slog.Int("requeued", len(r.Requeued)),
		slog.Int("restarted", len(r.Restarted)),
		slog.Int("abandoned", len(r.Abandoned)),
		slog.Int("restart_limit_exceeded", len(r.LimitExceeded)),
		slog.Int("waits_woken", len(r.WaitsWoken)),
		slog.Int("completed", len(r.Completed)),
	)
}

func (r Report) String() string {
	return fmt.Sprintf("conversation %s: requeued %v (restarts counted %v), abandoned %v, restart limit exceeded %v, waits woken %v, completed %v",
		r.ConversationID, r.Requeued, r.Restarted, r.Abandoned, r.LimitExceeded, r.WaitsWoken, r.Completed)
}
