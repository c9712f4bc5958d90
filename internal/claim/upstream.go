package claim

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// A claim the upstream completes (complete_by upstream): the upstream calls
// <table>_commit with the claim's value in the transaction of its work, so
// at the end of the forward the claim's row says whether the work
// committed. The Keeper renews such a claim without ever waiting for the
// upstream's row lock (KeepUpstream) and settles it by the row
// (Conclude), never by what the forward showed.

// DefaultCommitWait bounds Conclude's wait for an upstream transaction
// that still holds the claim's row when the forward ends (between its
// <table>_commit and its commit): 30s. Past it the claim is left as it is:
// its lease expires, and the next claim judges the row once that
// transaction has ended.
const DefaultCommitWait = 30 * time.Second

// upstreamStore is what an upstream-completed claim needs of the store:
// store.Rules over PostgreSQL.
type upstreamStore interface {
	Conclude(ctx context.Context, p store.ConcludeParams) (store.Truth, error)
	KeepUpstream(ctx context.Context, scope, eventID, token string, lease time.Duration) (done bool, err error)
}

// SupportsUpstream reports whether s can hold upstream-completed claims.
func SupportsUpstream(s store.Store) bool {
	_, ok := s.(upstreamStore)
	return ok && store.SupportsUpstreamCommit(s)
}

// renew is a claim's heartbeat: Heartbeat, or for an upstream-completed
// claim KeepUpstream, which never waits for the upstream's lock.
func (k *Keeper) renew(ctx context.Context, c Ref) error {
	if c.ByUpstream {
		if us, ok := k.o.Store.(upstreamStore); ok {
			_, err := us.KeepUpstream(ctx, c.Scope, c.ID, c.Token, k.o.Lease)
			return err
		}
	}
	return k.o.Store.Heartbeat(ctx, c.Scope, c.ID, c.Token, k.o.Lease)
}

// Conclude settles refs by the truth of refs[0], an upstream-completed
// claim: it reads the claim's row, waiting at most wait (DefaultCommitWait
// when 0) for a transaction holding it, and completes (the upstream
// committed, or answered 2xx without committing) or releases it. The other
// refs (dedupe_body's body hash) follow: completed when the event is,
// released when it is released, left alone otherwise. status is the
// upstream's answer (0: none arrived); refs[0].Resp is stored with a
// completed row (replay response). A store error leaves the claims as they
// are (their leases expire as after a crash, and the next claim reads the
// row) and is returned.
func (k *Keeper) Conclude(parent context.Context, refs []Ref, status int, wait time.Duration) (store.Truth, error) {
	us, ok := k.o.Store.(upstreamStore)
	if !ok {
		return 0, errors.New("concluding claim: the store cannot hold upstream-completed claims")
	}
	if wait <= 0 {
		wait = DefaultCommitWait
	}
	c := refs[0]
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), k.o.StoreTimeout+wait)
	defer cancel()
	t0 := time.Now()
	truth, err := us.Conclude(ctx, store.ConcludeParams{Scope: c.Scope, EventID: c.ID, Token: c.Token,
		Status: status, Response: c.Resp, Wait: wait})
	observe(k.o.Timers.Complete, t0)
	if err != nil {
		k.o.Logger.Warn("reading the claim's truth failed; its lease will expire and the next delivery reads it",
			zap.String("scope", c.Scope), zap.String("event_id", c.ID), zap.Error(err))
		return 0, err
	}
	rest := refs[1:]
	switch truth {
	case store.TruthCommitted, store.TruthCompletedUncommitted:
		if len(rest) > 0 {
			k.Settle(parent, rest, status, Complete)
		}
	case store.TruthReleased:
		if len(rest) > 0 {
			k.Settle(parent, rest, status, Release)
		}
	case store.TruthLost:
		k.lost(c, Complete)
	case store.TruthPending:
		k.o.Logger.Warn("the upstream's transaction still held the claim when the wait ended; "+
			"its lease will expire and the next delivery reads what that transaction left",
			zap.String("scope", c.Scope), zap.String("event_id", c.ID), zap.Duration("waited", wait))
	}
	return truth, nil
}
