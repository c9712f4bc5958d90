package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// lateDriver commits a claim and then holds its answer until the test lets
// it through, as a reply still on the wire when the caller hangs up: the
// answer is then the context's error (what a driver reports when its
// context ends during the read) although the claim committed.
type lateDriver struct {
	store.Driver
	committed chan struct{} // one send per claim statement, once it ran
	answer    chan struct{} // one receive per claim statement
}

func (d lateDriver) QueryStmt(ctx context.Context, stmt store.Stmt, args ...any) store.Row {
	row := d.Driver.QueryStmt(ctx, stmt, args...)
	if stmt != store.StmtClaim {
		return row
	}
	return lateRow{Row: row, ctx: ctx, d: d}
}

// lateRow is the claim statement's row: run when scanned.
type lateRow struct {
	store.Row
	ctx context.Context //nolint:containedctx // the statement's, judged when its answer is let through
	d   lateDriver
}

func (r lateRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.d.committed <- struct{}{}
	<-r.d.answer
	if err == nil && r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	return err
}

// RunGaveUp checks the one-statement claim path (store.NewRules over d,
// which must be the backend's driver on a fresh table that get reads) for
// a caller that gives up after its claim committed and before the answer
// came: the claim is released with its own token (the provider's retry is
// claimed, not answered InFlight), and Claim returns the caller's error.
// Without and with a request fingerprint (Idempotency-Key claims).
func RunGaveUp(t *testing.T, d store.Driver, get func(ctx context.Context, scope, id string) (store.Event, error)) {
	t.Helper()
	for _, fp := range []string{"", "sha256:fingerprint"} {
		name := "webhook"
		if fp != "" {
			name = "idempotency-key"
		}
		t.Run("gave up after commit/"+name, func(t *testing.T) {
			ld := lateDriver{Driver: d, committed: make(chan struct{}, 1), answer: make(chan struct{}, 1)}
			r := store.NewRules(ld)
			p := store.ClaimParams{Scope: "stripe", EventID: "evt_gone_" + name, Lease: time.Hour, Fingerprint: fp}

			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			errc := make(chan error, 1)
			go func() {
				_, err := r.Claim(ctx, p)
				errc <- err
			}()
			<-ld.committed
			cancel() // the provider hangs up with the claim committed
			ld.answer <- struct{}{}
			require.ErrorIs(t, <-errc, context.Canceled)

			ev, err := get(t.Context(), p.Scope, p.EventID)
			require.NoError(t, err)
			require.Equal(t, store.StateReleased, ev.State, "the claim committed for nobody is given back")

			// The provider's retry is claimed at once, not answered InFlight.
			ld.answer <- struct{}{}
			c, err := r.Claim(t.Context(), p)
			require.NoError(t, err)
			<-ld.committed
			require.Equal(t, store.Claimed, c.Outcome)
			require.NoError(t, r.Complete(t.Context(), p.Scope, p.EventID, c.Token, 200))
		})
	}

	t.Run("gave up after commit/another's claim untouched", func(t *testing.T) {
		// A caller that gives up on a claim another delivery holds releases
		// nothing: its release carries its own token only.
		ld := lateDriver{Driver: d, committed: make(chan struct{}, 2), answer: make(chan struct{}, 2)}
		r := store.NewRules(ld)
		p := store.ClaimParams{Scope: "stripe", EventID: "evt_held_by_another", Lease: time.Hour}
		ld.answer <- struct{}{}
		first, err := r.Claim(t.Context(), p)
		require.NoError(t, err)
		<-ld.committed
		require.Equal(t, store.Claimed, first.Outcome)

		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			c, err := r.Claim(ctx, p)
			if err == nil && c.Outcome != store.InFlight {
				err = fmt.Errorf("claim of an event in flight answered %v", c.Outcome)
			}
			errc <- err
		}()
		<-ld.committed // refused: the row is in flight under first's token
		cancel()
		ld.answer <- struct{}{}
		err = <-errc
		require.NoError(t, err, "answered InFlight: nothing was taken, so nothing is given back")
		ev, err := get(t.Context(), p.Scope, p.EventID)
		require.NoError(t, err)
		require.Equal(t, store.StateProcessing, ev.State, "the other delivery keeps its claim")
		require.NoError(t, r.Complete(t.Context(), p.Scope, p.EventID, first.Token, 200))
	})
}
