package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/tidwall/gjson"
)

// CommitAction is what a CommitUpstream does with one request: the
// application's transaction (its effect, then <table>_commit with the
// request's Webhook-Claim), then its answer on the socket.
type CommitAction struct {
	// Work is waited inside the transaction before the <table>_commit call
	// (the handler's own work, slow).
	Work time.Duration
	// Hold is waited after the call, with the transaction still open.
	Hold time.Duration
	// Rollback rolls the transaction back instead of committing it.
	Rollback bool
	// NoCall leaves out the <table>_commit call (an upstream that breaks
	// the contract).
	NoCall bool
	// Answer is what is written after the transaction ended (Delay, Close,
	// Reset, Status as RawAction); a refused call answers 500 unless
	// Answer closes.
	Answer RawAction
}

// CommitBehaviour decides the action for the n-th request (1-based) of an
// event.
type CommitBehaviour func(eventID string, n int) CommitAction

// CommitUpstream is an upstream application written as the examples are:
// each webhook runs one transaction on the gateway's database that records
// its effect in an effects table and calls <table>_commit with the
// Webhook-Claim header, then answers. Effects counts the committed
// effects of an event: its executions. It serves on a raw socket of
// 127.0.0.1, so it can commit and then drop the connection unanswered.
type CommitUpstream struct {
	*rawServer
	pool    *pgxpool.Pool
	fn      string
	effects string
	behave  CommitBehaviour

	mu       sync.Mutex
	calls    map[string]int
	refused  map[string]int
	noClaim  int
	claimErr []string
	claims   []string // every Webhook-Claim received, to search logs for
	active   int      // requests being served
}

// NewCommitUpstream creates the effects table in dsn's database and
// starts serving. fn is the commit function's name ("webhook_events_commit").
func NewCommitUpstream(ctx context.Context, dsn, fn string, behave CommitBehaviour) (*CommitUpstream, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	// A connection per transaction in flight: transactions that sleep (Work,
	// Hold) must not make the others wait for a connection.
	cfg.MaxConns = 128
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	u := &CommitUpstream{pool: pool, fn: pgx.Identifier{fn}.Sanitize(), effects: "app_effects", behave: behave,
		calls: map[string]int{}, refused: map[string]int{}}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS app_effects (
			event_id text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		pool.Close()
		return nil, err
	}
	u.rawServer, err = startRawServer(60*time.Second, u.handle)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return u, nil
}

// Close stops accepting, waits for the requests being served, and closes
// the pool.
func (u *CommitUpstream) Close() {
	u.rawServer.Close()
	u.pool.Close()
}

// Calls is how many requests of the event the upstream read.
func (u *CommitUpstream) Calls(eventID string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[eventID]
}

// Refused is how many of the event's transactions <table>_commit refused
// (their claim was no longer theirs; they rolled back).
func (u *CommitUpstream) Refused(eventID string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.refused[eventID]
}

// Unexpected returns the requests that came without a Webhook-Claim and
// the calls that failed for another reason than a refused claim.
func (u *CommitUpstream) Unexpected() (noClaim int, errs []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.noClaim, append([]string(nil), u.claimErr...)
}

// Claims returns every Webhook-Claim value received.
func (u *CommitUpstream) Claims() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.claims...)
}

// WaitIdle waits until no transaction is running (at most until ctx ends).
func (u *CommitUpstream) WaitIdle(ctx context.Context) error {
	for {
		u.mu.Lock()
		n := u.active
		u.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d transactions still running: %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Effects is the number of committed effects of the event: executions.
func (u *CommitUpstream) Effects(ctx context.Context, eventID string) (int, error) {
	var n int
	err := u.pool.QueryRow(ctx, `SELECT count(*) FROM app_effects WHERE event_id = $1`, eventID).Scan(&n)
	return n, err
}

// handle records the request, runs the application's transaction and
// returns the answer to write ("ok", or 500 when <table>_commit refused).
func (u *CommitUpstream) handle(req *http.Request, body []byte) (RawAction, func()) {
	id := gjson.GetBytes(body, "id").String()
	claim := req.Header.Get("Webhook-Claim")
	u.mu.Lock()
	u.calls[id]++
	n := u.calls[id]
	if claim == "" {
		u.noClaim++
	} else {
		u.claims = append(u.claims, claim)
	}
	u.active++
	u.mu.Unlock()

	a := u.behave(id, n)
	refused := u.transact(id, claim, a)
	u.mu.Lock()
	u.active--
	u.mu.Unlock()
	ans := a.Answer
	if refused && !ans.Close && !ans.Reset {
		ans.Status = http.StatusInternalServerError
	}
	if ans.BodyBytes == 0 && ans.ContentLength == 0 {
		ans.BodyBytes = 2
	}
	return ans, nil
}

// transact runs the application's transaction; refused reports that
// <table>_commit raised (the transaction rolled back).
func (u *CommitUpstream) transact(id, claim string, a CommitAction) (refused bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := func() error {
		tx, err := u.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(ctx, `INSERT INTO app_effects (event_id) VALUES ($1)`, id); err != nil {
			return err
		}
		time.Sleep(a.Work)
		if !a.NoCall {
			if _, err := tx.Exec(ctx, `SELECT `+u.fn+`($1)`, claim); err != nil {
				return err
			}
		}
		time.Sleep(a.Hold)
		if a.Rollback {
			return tx.Rollback(ctx)
		}
		return tx.Commit(ctx)
	}()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return false
	case errors.As(err, &pgErr) && pgErr.Code == "WI001":
		u.mu.Lock()
		u.refused[id]++
		u.mu.Unlock()
		return true
	}
	u.mu.Lock()
	u.claimErr = append(u.claimErr, err.Error())
	u.mu.Unlock()
	return true
}
