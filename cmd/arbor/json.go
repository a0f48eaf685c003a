package main

import (
	"encoding/json"
	"io"
	"time"

	"github.com/arborhq/arbor/arbortype"
)

// taskJSON is a task as --json prints it: every column, in snake_case as in
// the database, so that a script reads the same names it would query.
// Children are filled in by tree (nested) and by show (one level).
type taskJSON struct {
	ID               int64                 `json:"id"`
	ConversationID   string                `json:"conversation_id"`
	OwnerID          int64                 `json:"owner_id,omitempty"`
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
	WakeAt           *time.Time            `json:"wake_at,omitempty"`
	Token            int64                 `json:"token,omitempty"`
	LeaseExpiresAt   *time.Time            `json:"lease_expires_at,omitempty"`
	IdempotencyKey   string                `json:"idempotency_key,omitempty"`
	Input            json.RawMessage       `json:"input,omitempty"`
	State            json.RawMessage       `json:"state,omitempty"`
	Result           json.RawMessage       `json:"result,omitempty"`
	Error            *arbortype.TaskError  `json:"error,omitempty"`
	ErrorHistory     []arbortype.FailedTry `json:"error_history,omitempty"`
	CreatedAt        time.Time             `json:"created_at"`
	UpdatedAt        time.Time             `json:"updated_at"`
	StartedAt        *time.Time            `json:"started_at,omitempty"`
	SettledAt        *time.Time            `json:"settled_at,omitempty"`
	Children         []taskJSON            `json:"children,omitempty"`
}

func toJSON(t arbortype.Task) taskJSON {
	return taskJSON{
		ID: t.ID, ConversationID: t.ConversationID, OwnerID: t.OwnerID, Kind: t.Kind, Status: string(t.Status),
		Background: t.Background, Phase: t.Phase, Attempt: t.Attempt, RestartLimit: t.RestartLimit,
		Retries: t.Retries, MaxRetries: t.MaxRetries, AbandonOnRestart: t.AbandonOnRestart,
		AbortRequested: t.AbortRequested, WaitPolicy: string(t.WaitPolicy), WaitIDs: t.WaitIDs,
		WakeAt: t.WakeAt, Token: t.Token, LeaseExpiresAt: t.LeaseExpiresAt, IdempotencyKey: t.IdempotencyKey,
		Input: t.Input, State: t.State, Result: t.Result, Error: t.Error, ErrorHistory: t.ErrorHistory,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, StartedAt: t.StartedAt, SettledAt: t.SettledAt,
	}
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
