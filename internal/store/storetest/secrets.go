package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

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

	now := time.Now()
	// learn stores secret within a window opened for the call.
	learn := func(t *testing.T, s store.Secrets, scope, secret string, replace bool) error {
		t.Helper()
		require.NoError(t, s.Enroll(t.Context(), scope, now.Add(time.Minute)))
		return s.LearnSecret(t.Context(), store.Learn{Scope: scope, Secret: secret, Replace: replace, Now: now})
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
		require.NoError(t, learn(t, s, "asana", "first", false))
		got, err := s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, "asana", got.Scope)
		require.Equal(t, "first", got.Secret)
		require.False(t, got.LearnedAt.IsZero())

		// The same secret again (a repeated handshake) is accepted and
		// keeps its time.
		require.NoError(t, learn(t, s, "asana", "first", false))
		again, err := s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, got.LearnedAt, again.LearnedAt)

		// A different one is refused without replace, and the first stays.
		require.ErrorIs(t, learn(t, s, "asana", "second", false), store.ErrSecretExists)
		got, err = s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, "first", got.Secret)

		// Scopes are apart.
		require.NoError(t, learn(t, s, "asana-2", "other", false))
		got, err = s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, "first", got.Secret)
	})

	t.Run("SecretReplaced", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		ctx := t.Context()
		require.NoError(t, learn(t, s, "notion", "first", false))
		require.NoError(t, learn(t, s, "notion", "second", true))
		got, err := s.LearnedSecret(ctx, "notion")
		require.NoError(t, err)
		require.Equal(t, "second", got.Secret)

		require.NoError(t, s.ForgetLearnedSecret(ctx, "notion"))
		_, err = s.LearnedSecret(ctx, "notion")
		require.ErrorIs(t, err, store.ErrNotFound)
		require.NoError(t, learn(t, s, "notion", "third", false))
	})

	t.Run("SecretEmptyRefused", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		require.Error(t, learn(t, s, "asana", "", true))
		_, err := s.LearnedSecret(t.Context(), "asana")
		require.ErrorIs(t, err, store.ErrNotFound)
	})

	t.Run("SecretRaceOneWins", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		const n = 8
		require.NoError(t, s.Enroll(t.Context(), "asana", now.Add(time.Minute)))
		var (
			wg  sync.WaitGroup
			mu  sync.Mutex
			won []string
		)
		for i := range n {
			wg.Go(func() {
				secret := string(rune('a' + i))
				err := s.LearnSecret(t.Context(), store.Learn{Scope: "asana", Secret: secret, Now: now})
				if err == nil {
					mu.Lock()
					won = append(won, secret)
					mu.Unlock()
					return
				}
				// The winner closes the window.
				if !errors.Is(err, store.ErrSecretExists) && !errors.Is(err, store.ErrEnrollmentClosed) {
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

	t.Run("SecretEnrollmentWindow", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		ctx := t.Context()
		at := func(d time.Duration) time.Time { return now.Add(d) }
		learnAt := func(d time.Duration, secret string, replace bool) error {
			return s.LearnSecret(ctx, store.Learn{Scope: "asana", Secret: secret, Replace: replace, Now: at(d), From: "192.0.2.7", By: "gw-1"})
		}
		// Nothing opened: refused.
		require.ErrorIs(t, learnAt(0, "early", false), store.ErrEnrollmentClosed)
		// The first load opens a window of 10m.
		require.NoError(t, s.RouteLoaded(ctx, "asana", at(0), 10*time.Minute))
		require.ErrorIs(t, learnAt(11*time.Minute, "late", false), store.ErrEnrollmentClosed)
		require.NoError(t, learnAt(time.Minute, "real", false))
		got, err := s.LearnedSecret(ctx, "asana")
		require.NoError(t, err)
		require.Equal(t, store.LearnedSecret{Scope: "asana", Secret: "real", LearnedAt: got.LearnedAt, From: "192.0.2.7", By: "gw-1"}, got)
		// Learning closed the window: even replace is refused now; the
		// same secret again is accepted.
		require.ErrorIs(t, learnAt(2*time.Minute, "planted", true), store.ErrEnrollmentClosed)
		require.NoError(t, learnAt(time.Hour, "real", false))
		// A later load opens nothing, even once the secret is forgotten.
		require.NoError(t, s.ForgetLearnedSecret(ctx, "asana"))
		require.NoError(t, s.RouteLoaded(ctx, "asana", at(time.Hour), 10*time.Minute))
		require.ErrorIs(t, learnAt(time.Hour+time.Minute, "planted", false), store.ErrEnrollmentClosed)
		// The operator opens one.
		require.NoError(t, s.Enroll(ctx, "asana", at(time.Hour+10*time.Minute)))
		require.NoError(t, learnAt(time.Hour+time.Minute, "again", false))

		list, err := s.LearnedSecrets(ctx)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, "again", list[0].Secret)
		require.Equal(t, at(0).UnixMilli(), list[0].FirstLoadedAt.UnixMilli())
		require.Equal(t, at(time.Hour+time.Minute).UnixMilli(), list[0].EnrollUntil.UnixMilli(), "closed when learned")
	})

	t.Run("SecretEnrollmentListsScopesWithoutSecret", func(t *testing.T) {
		t.Parallel()
		s := secrets(t, newStore(t))
		ctx := t.Context()
		require.NoError(t, s.RouteLoaded(ctx, "notion", now, 0))
		require.ErrorIs(t, s.LearnSecret(ctx, store.Learn{Scope: "notion", Secret: "x", Now: now}), store.ErrEnrollmentClosed)
		require.NoError(t, s.RouteLoaded(ctx, "asana", now, time.Minute))
		list, err := s.LearnedSecrets(ctx)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, "asana", list[0].Scope)
		require.Empty(t, list[0].Secret)
		require.Equal(t, now.Add(time.Minute).UnixMilli(), list[0].EnrollUntil.UnixMilli())
		require.Equal(t, "notion", list[1].Scope)
		require.True(t, list[1].EnrollUntil.IsZero())
		require.Equal(t, now.UnixMilli(), list[1].FirstLoadedAt.UnixMilli())
	})

	if reopen != nil {
		t.Run("SecretSurvivesReopen", func(t *testing.T) {
			t.Parallel()
			first := newStore(t)
			require.NoError(t, learn(t, secrets(t, first), "asana", "kept", false))
			second := secrets(t, reopen(t, first))
			got, err := second.LearnedSecret(t.Context(), "asana")
			require.NoError(t, err)
			require.Equal(t, "kept", got.Secret)
		})
	}
}
