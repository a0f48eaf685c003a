package arborhttp_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arborhttp"
	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/migrations"
)

// Every sentinel of arbortype has a status of its own choosing: a new one
// must be placed (else it would be a 500), and the message is never the
// error's text.
func TestEverySentinelHasAStatus(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	files, err := filepath.Glob("../arbortype/*.go")
	require.NoError(t, err)
	var names []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok {
				for _, id := range vs.Names {
					if strings.HasPrefix(id.Name, "Err") && id.IsExported() {
						names = append(names, id.Name)
					}
				}
			}
			return true
		})
	}
	require.Contains(t, names, "ErrNotFound")
	byName := map[string]error{
		"ErrNotFound": arbortype.ErrNotFound, "ErrInvalidTransition": arbortype.ErrInvalidTransition,
		"ErrInvalidArgument": arbortype.ErrInvalidArgument, "ErrInvalidJSON": arbortype.ErrInvalidJSON,
		"ErrPayloadTooLarge": arbortype.ErrPayloadTooLarge, "ErrOwnerNotLive": arbortype.ErrOwnerNotLive,
		"ErrOwnerCompleting": arbortype.ErrOwnerCompleting, "ErrOwnerAborting": arbortype.ErrOwnerAborting,
		"ErrForeignOwner": arbortype.ErrForeignOwner, "ErrIdempotencyConflict": arbortype.ErrIdempotencyConflict,
		"ErrAlreadyRunning": arbortype.ErrAlreadyRunning, "ErrNotRunning": arbortype.ErrNotRunning,
		"ErrLeaseLost": arbortype.ErrLeaseLost, "ErrAborted": arbortype.ErrAborted, "ErrNotChild": arbortype.ErrNotChild,
		"ErrLeaseHeld": arbortype.ErrLeaseHeld, "ErrForeignTask": arbortype.ErrForeignTask,
		"ErrNotSleeping": arbortype.ErrNotSleeping, "ErrSettled": arbortype.ErrSettled, "ErrAwaitEnded": arbortype.ErrAwaitEnded,
		"ErrConcurrencyLimit": arbortype.ErrConcurrencyLimit, "ErrBusy": arbortype.ErrBusy,
		"ErrNotSettled": arbortype.ErrNotSettled, "ErrNotRoot": arbortype.ErrNotRoot,
		"ErrConversationExists": arbortype.ErrConversationExists, "ErrUnavailable": arbortype.ErrUnavailable,
		"ErrPermissionDenied": arbortype.ErrPermissionDenied, "ErrDatabase": arbortype.ErrDatabase,
		"ErrAmbiguous": arbortype.ErrAmbiguous, "ErrNonRetryable": arbortype.ErrNonRetryable,
		"ErrBudgetExhausted": arbortype.ErrBudgetExhausted, "ErrUnknownCounter": arbortype.ErrUnknownCounter,
	}
	internal := map[string]bool{"ErrDatabase": true, "ErrPermissionDenied": true, "ErrNonRetryable": true}
	for _, name := range names {
		sentinel, ok := byName[name]
		require.True(t, ok, "arbortype.%s is new: give it a status in arborhttp and a line here", name)
		status, msg := arborhttp.Status(fmt.Errorf("create task 42 in %q: %w", "secret-table", sentinel))
		require.NotEmpty(t, msg, name)
		require.NotContains(t, msg, "secret-table", "%s: the message is not the error's text", name)
		if internal[name] {
			require.Equal(t, http.StatusInternalServerError, status, name)
		} else {
			require.NotEqual(t, http.StatusInternalServerError, status, "%s is the client's to know", name)
		}
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err    error
		status int
	}{
		{nil, http.StatusOK},
		{arbortype.ErrNotFound, http.StatusNotFound},
		{fmt.Errorf("create: %w", arbortype.ErrBusy), http.StatusConflict},
		{arbortype.ErrOwnerCompleting, http.StatusConflict},
		{&arbortype.BudgetExhaustedError{}, http.StatusTooManyRequests},
		{arbortype.ErrAmbiguous, http.StatusServiceUnavailable},
		{arbortype.ErrUnavailable, http.StatusServiceUnavailable},
		{migrations.ErrVersionMismatch, http.StatusServiceUnavailable},
		{arbortype.ErrAwaitEnded, http.StatusGone},
		{fmt.Errorf("read: %w", context.DeadlineExceeded), http.StatusGatewayTimeout},
		{context.Canceled, 499},
		{errors.New("something else"), http.StatusInternalServerError},
	} {
		got, _ := arborhttp.Status(c.err)
		require.Equal(t, c.status, got, "%v", c.err)
	}
	_, msg := arborhttp.Status(fmt.Errorf("emit: %w", arbortype.ErrAwaitEnded))
	require.Equal(t, "the await is over", msg)
}
