package core

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/store"
)

// notStored are the fields of a create that are not columns of its task
// row, and where each goes instead. A field added to arbortype.CreateParams
// (or to CreateParams) must be stored by createParams or named here.
var notStored = map[string]string{
	"CreateParams":        "the embedded user's params, whose fields are checked one by one",
	"OnBusy":              "package tasks applies the turn policy before the create",
	"SteerEvent":          "package tasks applies the turn policy before the create",
	"Budgets":             "ApplyCreateBudgets, in the create's transaction",
	"ConversationBudgets": "ApplyCreateBudgets, in the create's transaction",
	"OwnerToken":          "checkHolder fences the create by the owner's run",
}

// Every field of a create reaches its task row (store.InsertParams) as it
// was given, or is one of notStored: a new create option fails here until
// the test sets it, and then until createParams stores it (or notStored
// says where it goes).
func TestCreateParamsReachTheRow(t *testing.T) {
	t.Parallel()
	e := &Engine{Cfg: Config{MaxPayloadBytes: 1 << 20, RestartLimit: 5, RetryBackoffBase: time.Second, RetryBackoffCap: time.Minute}}
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	p := CreateParams{
		CreateParams: arbortype.CreateParams{
			ConversationID: "c", OwnerID: 7, Kind: "k", Input: json.RawMessage(`{"a":1}`),
			Background: true, AbandonOnRestart: true, RestartLimit: 3, MaxRetries: 2,
			RetryBackoffBase: 2 * time.Second, RetryBackoffCap: 3 * time.Second,
			IdempotencyKey: "key", Deadline: deadline,
			OnBusy: arbortype.TurnQueue, SteerEvent: "message",
			Budgets:             []arbortype.BudgetLimit{{Counter: "tokens", Max: 10}},
			ConversationBudgets: []arbortype.BudgetLimit{{Counter: "tokens", Max: 100}},
			Tenant:              "acme", Priority: 5, ConcurrencyKey: "search", QueueTTL: time.Minute,
		},
		OwnerToken: 9,
		Trace:      map[string]string{"traceparent": "00-1-2-01"},
	}
	got, err := e.createParams(p)
	require.NoError(t, err)
	require.Equal(t, store.InsertParams{
		ConversationID: "c", OwnerID: 7, Kind: "k", Input: json.RawMessage(`{"a":1}`),
		Background: true, AbandonOnRestart: true, RestartLimit: 3, MaxRetries: 2,
		RetryBackoffBase: 2 * time.Second, RetryBackoffCap: 3 * time.Second,
		IdempotencyKey: "key", Deadline: &deadline, Trace: json.RawMessage(`{"traceparent":"00-1-2-01"}`),
		Tenant: "acme", Priority: 5, ConcurrencyKey: "search", QueueTTL: time.Minute,
	}, got)

	// A field the test leaves unset would not be checked by the comparison
	// above; a field that is no column must say where it goes.
	row := reflect.TypeFor[store.InsertParams]()
	for _, f := range reflect.VisibleFields(reflect.TypeFor[CreateParams]()) {
		require.False(t, reflect.ValueOf(p).FieldByIndex(f.Index).IsZero(), "the test leaves CreateParams.%s unset", f.Name)
		if _, ok := row.FieldByName(f.Name); !ok {
			require.Contains(t, notStored, f.Name, "CreateParams.%s is neither a column (store.InsertParams) nor listed in notStored", f.Name)
		}
	}
}
