package postgres

import (
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

// interpretError maps driver errors at the queue's edge, as the store does:
// pgx.ErrNoRows becomes queue.ErrNotFound, and no driver type reaches
// callers (see pgschema.MapError). The queue never holds a DSN, so no
// message can carry a password.
func interpretError(err error) error { return pgschema.MapError(err, queue.ErrNotFound) }
