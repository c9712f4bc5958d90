package store

import (
	"context"
	"errors"
	"time"
)

// ErrSecretExists: a different learned secret is already stored for the
// scope and the caller did not ask to replace it.
var ErrSecretExists = errors.New("a different learned secret is stored")

// ErrEnrollmentClosed: a handshake brought a secret the scope has not
// learned, and no enrollment window is open for the scope.
var ErrEnrollmentClosed = errors.New("no enrollment window is open")

// LearnedSecret is a signing secret a provider handed over in an endpoint
// handshake (Asana's X-Hook-Secret, Notion's verification_token), stored
// per scope, with the scope's enrollment window.
type LearnedSecret struct {
	Scope string
	// Secret is "" when none is learned (a scope with an enrollment record
	// only, listed by LearnedSecrets).
	Secret    string
	LearnedAt time.Time // when it was first stored or last replaced (database clock)
	// From is the address the teaching handshake came from, By the gateway
	// instance (host name) that stored it.
	From, By string
	// FirstLoadedAt is when a route of the scope was first loaded
	// (RouteLoaded); zero when never recorded. EnrollUntil is when the
	// scope's enrollment window closes (or closed); zero: never opened.
	FirstLoadedAt, EnrollUntil time.Time
}

// Learn is a secret a handshake brings.
type Learn struct {
	Scope, Secret string
	// Replace lets a different stored secret be replaced (learned_secret
	// replace); the window must be open still.
	Replace bool
	// Now is the gateway's clock, against which the window is judged.
	Now time.Time
	// From and By are recorded with the secret (LearnedSecret).
	From, By string
}

// Secrets stores the secrets learned in handshakes, one per scope, durably
// and shared by every gateway instance on the same database, and each
// scope's enrollment window: the time during which a handshake may teach a
// secret. It is separate from Store: the postgres and sqlite stores
// implement both, in tables of their own (<events table>_secrets and
// <events table>_secrets_enroll) with their own migration history
// (<events table>_secrets_goose_version). Secrets are stored as given
// (plaintext): whoever reads the table can sign deliveries.
type Secrets interface {
	// LearnSecret stores l.Secret (not empty) as the scope's learned
	// secret. The secret already stored is accepted again and changes
	// nothing, window or not. Otherwise the scope's enrollment window must
	// be open at l.Now (ErrEnrollmentClosed), and a different stored secret
	// is replaced only with l.Replace (ErrSecretExists); storing closes the
	// window. Concurrent calls are serialised: one wins.
	LearnSecret(ctx context.Context, l Learn) error
	// LearnedSecret returns scope's learned secret, or ErrNotFound when
	// none is stored.
	LearnedSecret(ctx context.Context, scope string) (LearnedSecret, error)
	// LearnedSecrets lists every scope with a learned secret or an
	// enrollment record, by scope.
	LearnedSecrets(ctx context.Context) ([]LearnedSecret, error)
	// ForgetLearnedSecret deletes scope's learned secret, so a handshake
	// may teach one again within an enrollment window; ErrNotFound when
	// there is none. The enrollment record stays.
	ForgetLearnedSecret(ctx context.Context, scope string) error
	// RouteLoaded records that a route of scope was loaded at now. The
	// first time (no record yet) it opens the enrollment window until
	// now+window, unless a secret is stored already or window is 0; later
	// loads change nothing.
	RouteLoaded(ctx context.Context, scope string, now time.Time, window time.Duration) error
	// Enroll sets scope's enrollment window to close at until (a time not
	// after the caller's clock closes it), creating the record if needed.
	Enroll(ctx context.Context, scope string, until time.Time) error
}
