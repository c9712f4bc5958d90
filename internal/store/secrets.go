package store

import (
	"context"
	"errors"
	"time"
)

// ErrSecretExists: a different learned secret is already stored for the
// scope and the caller did not ask to replace it.
var ErrSecretExists = errors.New("a different learned secret is stored")

// LearnedSecret is a signing secret a provider handed over in an endpoint
// handshake (Asana's X-Hook-Secret, Notion's verification_token), stored
// per scope.
type LearnedSecret struct {
	Scope     string
	Secret    string
	LearnedAt time.Time // when it was first stored or last replaced (database clock)
}

// Secrets stores the secrets learned in handshakes, one per scope, durably
// and shared by every gateway instance on the same database. It is separate
// from Store: the postgres and sqlite stores implement both, in a table of
// their own (<events table>_secrets) with its own migration history
// (<events table>_secrets_goose_version). Secrets are stored as given
// (plaintext): whoever reads the table can sign deliveries.
type Secrets interface {
	// SetLearnedSecret stores secret (not empty) as scope's learned secret
	// in one statement. When a different secret is stored already it is
	// replaced only if replace is set; otherwise ErrSecretExists is returned
	// and the stored one stays. Storing the same secret again succeeds and
	// changes nothing.
	SetLearnedSecret(ctx context.Context, scope, secret string, replace bool) error
	// LearnedSecret returns scope's learned secret, or ErrNotFound.
	LearnedSecret(ctx context.Context, scope string) (LearnedSecret, error)
	// ForgetLearnedSecret deletes scope's learned secret, so the provider's
	// next handshake is accepted; ErrNotFound when there is none.
	ForgetLearnedSecret(ctx context.Context, scope string) error
}
