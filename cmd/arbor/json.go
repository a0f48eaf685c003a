package main

import (
	"encoding/json"
	"io"
	"strconv"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// taskJSON is a task as --json prints it: every column, in snake_case as in
// the database, so that a script reads the same names it would query. It
// is one row and never nests others: tree and show list related tasks
// beside it, linked by id.
type taskJSON struct {
	ID               int64                 `json:"id"`
	ConversationID   string                `json:"conversation_id"`
	OwnerID          *int64                `json:"owner_id"` // null for a root
	Kind             string                `json:"kind"`
	Status           string                `json:"status"`
	Background       bool                  `json:"background"`
	Phase            string                `json:"phase"`
	Attempt          int                   `json:"attempt"`
	RestartLimit     int                   `json:"restart_limit"`
	Retries          int                   `json:"retries"`
	MaxRetries       int                   `json:"max_retries"`
	AbandonOnRestart bool                  `json:"abandon_on_restart"`
	AbortRequested   bool                  `json:"abort_requested"`
	WaitPolicy       string                `json:"wait_policy,omitempty"`
	WaitIDs          []int64               `json:"wait_ids,omitempty"`
	WakeAt           *jsonTime             `json:"wake_at,omitempty"`
	Token            int64                 `json:"token,omitempty"`
	LeaseExpiresAt   *jsonTime             `json:"lease_expires_at,omitempty"`
	IdempotencyKey   string                `json:"idempotency_key,omitempty"`
	Input            json.RawMessage       `json:"input,omitempty"`
	State            json.RawMessage       `json:"state,omitempty"`
	Result           json.RawMessage       `json:"result,omitempty"`
	Error            *arbortype.TaskError  `json:"error,omitempty"`
	ErrorHistory     []arbortype.FailedTry `json:"error_history,omitempty"`
	CreatedAt        jsonTime              `json:"created_at"`
	UpdatedAt        jsonTime              `json:"updated_at"`
	StartedAt        *jsonTime             `json:"started_at,omitempty"`
	SettledAt        *jsonTime             `json:"settled_at,omitempty"`
	// Tenant is "" for the default tenant; Priority 0 for none.
	Tenant         string    `json:"tenant"`
	Priority       int       `json:"priority"`
	ConcurrencyKey string    `json:"concurrency_key,omitempty"`
	QueueExpiresAt *jsonTime `json:"queue_expires_at,omitempty"`
}

func toJSON(t arbortype.Task) taskJSON {
	j := taskJSON{
		ID: t.ID, ConversationID: t.ConversationID, Kind: t.Kind, Status: string(t.Status),
		Background: t.Background, Phase: t.Phase, Attempt: t.Attempt, RestartLimit: t.RestartLimit,
		Retries: t.Retries, MaxRetries: t.MaxRetries, AbandonOnRestart: t.AbandonOnRestart,
		AbortRequested: t.AbortRequested, WaitPolicy: string(t.WaitPolicy), WaitIDs: t.WaitIDs,
		WakeAt: (*jsonTime)(t.WakeAt), Token: t.Token, LeaseExpiresAt: (*jsonTime)(t.LeaseExpiresAt),
		IdempotencyKey: t.IdempotencyKey, Input: t.Input, State: t.State, Result: t.Result, Error: t.Error,
		ErrorHistory: t.ErrorHistory, CreatedAt: jsonTime(t.CreatedAt), UpdatedAt: jsonTime(t.UpdatedAt),
		StartedAt: (*jsonTime)(t.StartedAt), SettledAt: (*jsonTime)(t.SettledAt),
		Tenant: t.Tenant, Priority: t.Priority, ConcurrencyKey: t.ConcurrencyKey, QueueExpiresAt: (*jsonTime)(t.QueueExpiresAt),
	}
	if t.OwnerID != 0 {
		j.OwnerID = &t.OwnerID
	}
	return j
}

// jsonTime is a time as --json writes it: RFC 3339 with nanoseconds, as
// time.Time's own MarshalJSON writes it, except for a year beyond 9999 or
// before 0. RFC 3339 cannot write those, and MarshalJSON refuses them, which
// would fail the whole document for one hand-edited row; here they keep
// all their digits and their sign, as in "20000-01-01T00:00:00Z".
type jsonTime time.Time

// MarshalJSON writes the time as a JSON string.
func (t jsonTime) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, time.Time(t).Format(time.RFC3339Nano)), nil
}

// writeJSON writes v as indented JSON, or as one compact line when compact
// (a stream of documents, as tree --watch --json prints).
func writeJSON(w io.Writer, v any, compact bool) error {
	enc := json.NewEncoder(w)
	if !compact {
		enc.SetIndent("", "  ")
	}
	return enc.Encode(v)
}
