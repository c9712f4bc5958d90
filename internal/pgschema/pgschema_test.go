package pgschema

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestMapError(t *testing.T) {
	t.Parallel()
	notFound := errors.New("not found")
	require.NoError(t, MapError(nil, notFound))
	require.ErrorIs(t, MapError(fmt.Errorf("scan: %w", pgx.ErrNoRows), notFound), notFound)
	require.ErrorIs(t, MapError(fmt.Errorf("q: %w", context.DeadlineExceeded), notFound), context.DeadlineExceeded)
	require.ErrorIs(t, MapError(context.Canceled, notFound), context.Canceled)

	pgErr := &pgconn.PgError{Code: "42P01", Message: "relation does not exist"}
	err := MapError(fmt.Errorf("exec: %w", pgErr), notFound)
	require.EqualError(t, err, "postgres: relation does not exist (SQLSTATE 42P01)")
	var target *pgconn.PgError
	require.NotErrorAs(t, err, &target, "driver types do not escape")
	require.NotErrorIs(t, MapError(pgx.ErrNoRows, nil), pgx.ErrNoRows)
}

func TestLockID(t *testing.T) {
	t.Parallel()
	a := LockID("public", "webhook_events")
	require.Equal(t, a, LockID("public", "webhook_events"), "stable")
	require.NotEqual(t, a, LockID("public", "other"))
	require.NotEqual(t, LockID("ab", "c"), LockID("a", "bc"), "parts are separated")
	require.GreaterOrEqual(t, a, int64(0))
}
