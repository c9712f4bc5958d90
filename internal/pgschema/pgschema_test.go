package pgschema

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
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

func TestMapErrorRetryable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		err            error
		conflict, lost bool
	}{
		{"serialization failure", &pgconn.PgError{Code: "40001", Message: "could not serialize access"}, true, false},
		{"deadlock", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, true, false},
		{"connection failure", &pgconn.PgError{Code: "08006", Message: "connection failure"}, false, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01", Message: "terminating connection"}, false, true},
		{"read only", &pgconn.PgError{Code: "25006", Message: "read-only transaction"}, false, false},
		{"unique violation", &pgconn.PgError{Code: "23505", Message: "duplicate key"}, false, false},
		{"eof", fmt.Errorf("read: %w", io.EOF), false, true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false, true},
		{"caller's deadline", context.DeadlineExceeded, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := MapError(fmt.Errorf("exec: %w", tc.err), nil)
			require.Equal(t, tc.conflict, errors.Is(err, store.ErrTxConflict), "%v", err)
			require.Equal(t, tc.lost, errors.Is(err, store.ErrConnectionLost), "%v", err)
			var pgErr *pgconn.PgError
			require.NotErrorAs(t, err, &pgErr, "driver types do not escape")
		})
	}
}

func TestRunnerRetriesConflicts(t *testing.T) {
	t.Parallel()
	conflict := MapError(&pgconn.PgError{Code: "40001", Message: "could not serialize access"}, nil)
	deadlock := MapError(&pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, nil)
	var reasons []string
	r := Runner{Retries: 3, Retried: func(reason string) { reasons = append(reasons, reason) }}

	runs := 0
	err := r.Run(t.Context(), func(context.Context) error {
		runs++
		switch runs {
		case 1:
			return conflict
		case 2:
			return deadlock
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, runs)
	require.Equal(t, []string{store.RetrySerialization, store.RetryDeadlock}, reasons)

	runs = 0
	err = r.Run(t.Context(), func(context.Context) error { runs++; return conflict })
	require.ErrorIs(t, err, store.ErrTxConflict, "bounded: the last conflict is returned")
	require.Equal(t, 4, runs, "one run and 3 retries")

	runs = 0
	other := errors.New("postgres: duplicate key (SQLSTATE 23505)")
	require.Equal(t, other, r.Run(t.Context(), func(context.Context) error { runs++; return other }))
	require.Equal(t, 1, runs, "other errors are not retried")

	runs = 0
	require.ErrorIs(t, Runner{}.Run(t.Context(), func(context.Context) error { runs++; return conflict }), store.ErrTxConflict)
	require.Equal(t, 1, runs, "the zero Runner (inside a caller's transaction) runs once")
}

func TestRunnerStatementDeadline(t *testing.T) {
	t.Parallel()
	lost := 0
	r := Runner{Timeout: 20 * time.Millisecond, Lost: func() { lost++ }}
	err := r.Run(t.Context(), func(ctx context.Context) error {
		<-ctx.Done()
		return MapError(ctx.Err(), nil)
	})
	require.ErrorIs(t, err, store.ErrConnectionLost, "no answer within the deadline: a lost connection")
	require.NotErrorIs(t, err, context.DeadlineExceeded, "not the caller's deadline")
	require.Equal(t, 1, lost)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	err = r.Run(ctx, func(ctx context.Context) error {
		<-ctx.Done()
		return MapError(ctx.Err(), nil)
	})
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's own deadline stays its own")
	require.NotErrorIs(t, err, store.ErrConnectionLost)
	require.Equal(t, 1, lost)
}
