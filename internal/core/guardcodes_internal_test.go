package core

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
	"github.com/arborhq/arbor/internal/guardrules"
)

// TestGuardCodesAreArborErrors: every code the database guards raise
// (class AB, fsm's SQLState constants) reaches a caller as ErrInvalidTransition, with
// the database's error kept in the chain; none as ErrDatabase.
func TestGuardCodesAreArborErrors(t *testing.T) {
	t.Parallel()
	for _, code := range []string{guardrules.SQLStateInvalidTransition, guardrules.SQLStateSettled, guardrules.SQLStateImmutable,
		guardrules.SQLStateInvalidInsert, guardrules.SQLStateColumn, guardrules.SQLStateDelete, guardrules.SQLStateConversation,
		guardrules.SQLStateFork, guardrules.SQLStateRecord} {
		pgErr := &pgconn.PgError{Code: code, Message: "arbor: refused"}
		err := mapDBError(pgErr)
		require.ErrorIs(t, err, arbortype.ErrInvalidTransition, code)
		require.NotErrorIs(t, err, arbortype.ErrDatabase, code)
		var got *pgconn.PgError
		require.True(t, errors.As(err, &got), code)
		require.Equal(t, code, got.Code)
	}
}
