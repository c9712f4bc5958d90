package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// interpretError maps driver errors at the queue's edge, as the store does:
// pgx.ErrNoRows becomes queue.ErrNotFound, context errors stay matchable
// with errors.Is, and anything else is flattened into a plain error, so
// callers never see driver types. The queue never holds a DSN, so no
// message can carry a password.
func interpretError(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return queue.ErrNotFound
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("postgres: %w", context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("postgres: %w", context.DeadlineExceeded)
	case errors.As(err, &pgErr):
		return fmt.Errorf("postgres: %s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("postgres: %s", err.Error())
}
