package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/arborhq/arbor/arbortype"
)

// Errors. Every error a Migrator returns wraps one of arbor's sentinels,
// or is the caller's own context error, or a *VersionError
// (ErrVersionMismatch): ErrInvalidArgument for a bad schema name or
// target, ErrPermissionDenied when the database refused the role (a role
// that does not own the schema, no CREATE on the database), ErrUnavailable
// when it could not be reached, ErrDatabase for anything else it refused.

const (
	sqlStateInsufficientPrivilege = "42501"
	sqlStateClassConnection       = "08"
)

// classify gives an error leaving the package its sentinel (see above).
func classify(err error) error {
	switch {
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, ErrVersionMismatch):
		return err
	}
	for _, s := range []error{arbortype.ErrInvalidArgument, arbortype.ErrPermissionDenied, arbortype.ErrUnavailable, arbortype.ErrDatabase} {
		if errors.Is(err, s) {
			return err
		}
	}
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlStateInsufficientPrivilege:
		return fmt.Errorf("%w: %w", arbortype.ErrPermissionDenied, err)
	case errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, sqlStateClassConnection) || strings.HasPrefix(pgErr.Code, "57P")):
		return fmt.Errorf("%w: %w", arbortype.ErrUnavailable, err)
	case errors.As(err, &pgErr):
		return fmt.Errorf("%w: %w", arbortype.ErrDatabase, err)
	case errors.As(err, &connectErr), pgconn.SafeToRetry(err), errors.Is(err, pgconn.ErrConnClosed):
		return fmt.Errorf("%w: %w", arbortype.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", arbortype.ErrDatabase, err)
}
