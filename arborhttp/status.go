package arborhttp

import (
	"context"
	"errors"
	"net/http"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/migrations"
)

// statuses maps each of arbor's sentinels to its status and message, in the
// order Status tries them: the more particular errors before the ones they
// match (ErrOwnerCompleting matches ErrOwnerNotLive).
var statuses = []struct {
	err     error
	status  int
	message string
}{
	{arbortype.ErrNotFound, http.StatusNotFound, "not found"},
	{arbortype.ErrInvalidArgument, http.StatusBadRequest, "invalid argument"},
	{arbortype.ErrInvalidJSON, http.StatusBadRequest, "invalid JSON"},
	{arbortype.ErrPayloadTooLarge, http.StatusRequestEntityTooLarge, "payload too large"},
	{arbortype.ErrForeignOwner, http.StatusBadRequest, "the owner belongs to another conversation"},
	{arbortype.ErrForeignTask, http.StatusBadRequest, "the task belongs to another conversation"},
	{arbortype.ErrNotChild, http.StatusBadRequest, "not a child of the task"},
	{arbortype.ErrNotRoot, http.StatusBadRequest, "not a turn (a root task)"},
	{arbortype.ErrUnknownCounter, http.StatusBadRequest, "no budget names the counter"},
	{arbortype.ErrBusy, http.StatusConflict, "a turn of the conversation is live"},
	{arbortype.ErrIdempotencyConflict, http.StatusConflict, "idempotency key already used for another task"},
	{arbortype.ErrConversationExists, http.StatusConflict, "conversation already exists"},
	{arbortype.ErrOwnerCompleting, http.StatusConflict, "the owner is completing"},
	{arbortype.ErrOwnerAborting, http.StatusConflict, "the owner is being aborted"},
	{arbortype.ErrOwnerNotLive, http.StatusConflict, "the owner is not live"},
	{arbortype.ErrSettled, http.StatusConflict, "the task is settled"},
	{arbortype.ErrNotSettled, http.StatusConflict, "the task is not settled"},
	{arbortype.ErrNotSleeping, http.StatusConflict, "the task is not sleeping"},
	{arbortype.ErrAlreadyRunning, http.StatusConflict, "the task is already running"},
	{arbortype.ErrNotRunning, http.StatusConflict, "the task is not running"},
	{arbortype.ErrAborted, http.StatusConflict, "the task is aborted"},
	{arbortype.ErrLeaseLost, http.StatusConflict, "lease lost"},
	{arbortype.ErrLeaseHeld, http.StatusConflict, "the conversation's lease is held"},
	{arbortype.ErrInvalidTransition, http.StatusConflict, "not possible in the task's status"},
	{arbortype.ErrAwaitEnded, http.StatusGone, "the await is over"},
	{arbortype.ErrBudgetExhausted, http.StatusTooManyRequests, "budget exhausted"},
	{arbortype.ErrConcurrencyLimit, http.StatusTooManyRequests, "concurrency limit reached"},
	{arbortype.ErrAmbiguous, http.StatusServiceUnavailable, "outcome unknown: retry with the same idempotency key"},
	{arbortype.ErrUnavailable, http.StatusServiceUnavailable, "database unavailable"},
	{migrations.ErrVersionMismatch, http.StatusServiceUnavailable, "the database schema is not migrated"},
	{arbortype.ErrNonRetryable, http.StatusInternalServerError, "internal error"},
	{arbortype.ErrPermissionDenied, http.StatusInternalServerError, "internal error"},
	{arbortype.ErrDatabase, http.StatusInternalServerError, "internal error"},
}

// Status returns the HTTP status for err, an error of arbor's (one that
// wraps a sentinel of package arbortype), and a short message to show the
// client: a client's mistake is 400 (invalid argument or JSON) or 413 (a
// payload too large), what is not there 404, what the task's or the
// conversation's state refuses 409 (a live turn under the reject policy, a
// task settled, an idempotency key reused…), an await answered too late 410,
// a budget or a concurrency limit 429, the database out of reach or an
// outcome unknown 503 (the client retries, with its idempotency key), the
// request's own context ended 504 (its deadline) or 499 (the client went),
// and anything else, arbor's database errors included, 500 "internal error".
// The message never carries the error's text, which may name tables or
// rows: log err itself. A nil err is 200 and "".
func Status(err error) (status int, message string) {
	if err == nil {
		return http.StatusOK, ""
	}
	for _, s := range statuses {
		if errors.Is(err, s.err) {
			return s.status, s.message
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timed out"
	case errors.Is(err, context.Canceled):
		return 499, "request cancelled" // nginx's "client closed request", for the server's logs
	}
	return http.StatusInternalServerError, "internal error"
}
