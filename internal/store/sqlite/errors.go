package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// interpretError maps driver errors at the store's edge: sql.ErrNoRows
// becomes store.ErrNotFound, context cancellation and deadlines stay
// matchable with errors.Is, and everything else (*sqlite.Error included) is
// flattened into a plain error, so callers never see driver types.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return store.ErrNotFound
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("sqlite: %w", context.Canceled)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sqlite: %w", context.DeadlineExceeded)
	}
	return fmt.Errorf("sqlite: %s", err.Error())
}
