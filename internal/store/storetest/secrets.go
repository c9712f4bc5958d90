package storetest

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// RunSecrets exercises a store.Secrets implementation. newStore must return
// an empty store of its own, as for Run; reopen, when not nil, opens a
// second store on the same database as the given one (another instance, or
// the same one after a restart).
func RunSecrets(t *testing.T, newStore func(t *testing.T) store.Store, reopen func(t *testing.T, s store.Store) store.Store) {
	t.Helper()
	secrets := func(t *testing.T, s store.Store) store.Secrets {
		t.Helper()
		ss, ok := s.(store.Secrets)
		require.True(t, ok, "%T does not implement store.Secrets", s)
		return ss
	}

	t.Run("SecretNotFound", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		_, err := s.LearnedSecret(t.Context(), "asana")
		require.ErrorIs(t, err, store.ErrNotFound)
		require.ErrorIs(t, s.ForgetLearnedSecret(t.Context(), "asana"), store.ErrNotFound)
	})

	t.Run("SecretLearnedOnceThenRefused", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		ctx := t.Context()
		require.NoError(t, s.SetLearnedSecret(ctx, "asana", "first", false))
		got, err := s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, "asana", got.Scope)
		require.Equal(t, "first", got.Secret)
		require.False(t, got.LearnedAt.IsZero())

		// The same secret again (a repeated handshake) is accepted and
		// keeps its time.
		require.NoError(t, s.SetLearnedSecret(ctx, "asana", "first", false))
		again, err := s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, got.LearnedAt, again.LearnedAt)

		// A different one is refused without replace, and the first stays.
		require.ErrorIs(t, s.SetLearnedSecret(ctx, "asana", "second", false), store.ErrSecretExists)
		got, err = s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, "first", got.Secret)

		// Scopes are apart.
		require.NoError(t, s.SetLearnedSecret(ctx, "asana-2", "other", false))
		got, err = s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, "first", got.Secret)
	})

	t.Run("SecretReplaced", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		ctx := t.Context()
		require.NoError(t, s.SetLearnedSecret(ctx, "notion", "first", false))
		require.NoError(t, s.SetLearnedSecret(ctx, "notion", "second", true))
		got, err := s.LearnedSecret(ctx, "notion")
		require.NoError(t, err)
		require.Equal(t, "second", got.Secret)

		require.NoError(t, s.ForgetLearnedSecret(ctx, "notion"))
		_, err = s.LearnedSecret(ctx, "notion")
		require.ErrorIs(t, err, store.ErrNotFound)
		require.NoError(t, s.SetLearnedSecret(ctx, "notion", "third", false))
	})

	t.Run("SecretEmptyRefused", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		require.Error(t, s.SetLearnedSecret(t.Context(), "asana", "", true))
		_, err := s.LearnedSecret(t.Context(), "asana")
		require.ErrorIs(t, err, store.ErrNotFound)
	})

	t.Run("SecretRaceOneWins", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		const n = 8
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			won []string
		)
		for i := range n {
			wg.Go(func() {
				secret := string(rune('a' + i))
				err := s.SetLearnedSecret(t.Context(), "asana", secret, false)
				if err == nil {
					mu.Lock()
					won = append(won, secret)
					mu.Unlock()
					return
				}
				if !errors.Is(err, store.ErrSecretExists) {
					t.Errorf("unexpected error: %v", err)
				}
			})
		}
		wg.Wait()
		require.Len(t, won, 1, "exactly one concurrent handshake stores its secret")
		got, err := s.LearnedSecret(t.Context(), "asana")
		require.NoError(t, err)
		require.Equal(t, won[0], got.Secret)
	})

	if reopen != nil {
		t.Run("SecretSurvivesReopen", func(t *testing.T) {
			t.Parallel()
			first := newStore(t)
			require.NoError(t, secrets(t, first).SetLearnedSecret(t.Context(), "asana", "kept", false))
			second := secrets(t, reopen(t, first))
			got, err := second.LearnedSecret(t.Context(), "asana")
			require.NoError(t, err)
			require.Equal(t, "kept", got.Secret)
		})
	}
}
