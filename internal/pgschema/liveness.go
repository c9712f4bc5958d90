package pgschema

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// TCP keepalives of the pool's connections: probes start after 15s of
// silence, every 5s, and 3 unanswered ones close the connection. They keep
// NAT, conntrack and load balancer entries alive (their idle timeouts are
// minutes), and find a peer that vanished without a reset within 30s
// instead of the kernel's two hours.
const (
	KeepAliveIdle     = 15 * time.Second
	KeepAliveInterval = 5 * time.Second
	KeepAliveCount    = 3
)

// Defaults of the pool's liveness checks.
const (
	// DefaultStatementTimeout bounds one statement (or one pipelined
	// batch) on the delivery path; see Runner. A healthy statement there
	// takes milliseconds; 2s leaves a claim that met a dead connection
	// the rest of its 5s to try again on another.
	DefaultStatementTimeout = 2 * time.Second
	// DefaultPingTimeout bounds the ping of a connection idle for a second
	// or more before it is handed out (pgxpool pings those).
	DefaultPingTimeout = time.Second
)

// PrepareLiveness makes a pool config find dead connections before a
// delivery pays for them:
//
//   - every connection is dialed with TCP keepalives (KeepAlive*);
//   - a connection idle for a second or more is pinged, within
//     pingTimeout, before it is handed out; a failed ping drops it and, when
//     the caller still waits, every other connection of the pool (w.Lost),
//     so the caller gets a newly dialed one instead of trying each dead
//     one in turn.
//
// A statement deadline (Runner) covers connections used again within the
// second.
func PrepareLiveness(cfg *pgxpool.Config, w *Watch, pingTimeout time.Duration) {
	cc := cfg.ConnConfig
	d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount,
	}}
	if cc.ConnectTimeout > 0 {
		d.Timeout = cc.ConnectTimeout
	}
	cc.DialFunc = d.DialContext
	if pingTimeout <= 0 {
		pingTimeout = DefaultPingTimeout
	}
	cfg.ShouldPing = func(ctx context.Context, p pgxpool.ShouldPingParams) bool {
		if p.IdleDuration < time.Second {
			return false
		}
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		err := p.Conn.Ping(pctx)
		cancel()
		if err == nil {
			return false
		}
		if ctx.Err() == nil {
			w.reset()
		}
		// pgxpool pings it again: a connection the failed ping closed
		// fails at once and is destroyed.
		return true
	}
}

// Runner runs a pool's statements: each within Timeout (0: the caller's
// context only), and a transaction the database rolled back for a
// conflict (store.ErrTxConflict) again, up to Retries times. The zero
// Runner runs f once, as is: what runs inside a caller's transaction
// (which a conflict has aborted: the caller retries it whole).
type Runner struct {
	// Retries bounds the runs after a conflict (store.MaxTxRetries).
	Retries int
	// Timeout bounds one run of f. A run that ends by this deadline while
	// the caller still waits returns store.ErrConnectionLost and calls
	// Lost: no answer in that time is taken for a dead connection.
	Timeout time.Duration
	// Lost is told of such a run (Watch.Lost); nil: nothing.
	Lost func()
	// Retried is told of each conflict retry.
	Retried store.RetryObserver
}

// Run runs f, which runs one transaction (a statement, a pipelined batch,
// or a transaction of its own) and returns errors mapped by MapError.
func (r Runner) Run(ctx context.Context, f func(ctx context.Context) error) error {
	for n := 0; ; n++ {
		err := r.once(ctx, f)
		var c *conflictError
		if err == nil || !errors.As(err, &c) || n >= r.Retries || ctx.Err() != nil {
			return err
		}
		if r.Retried != nil {
			r.Retried(c.reason())
		}
		if !store.Sleep(ctx, store.TxBackoff(n)) {
			return err
		}
	}
}

func (r Runner) once(ctx context.Context, f func(ctx context.Context) error) error {
	if r.Timeout <= 0 {
		return f(ctx)
	}
	sctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	err := f(sctx)
	if err != nil && ctx.Err() == nil && errors.Is(sctx.Err(), context.DeadlineExceeded) {
		if r.Lost != nil {
			r.Lost()
		}
		return fmt.Errorf("postgres: %w: no answer within %s (%v)", store.ErrConnectionLost, r.Timeout, err)
	}
	return err
}

// conflictError is a transaction rolled back by SQLSTATE 40001 or 40P01:
// store.ErrTxConflict, with the server's message.
type conflictError struct{ code, msg string }

func (e *conflictError) Error() string {
	return fmt.Sprintf("postgres: %s: %s (SQLSTATE %s)", store.ErrTxConflict, e.msg, e.code)
}

func (e *conflictError) Is(target error) bool { return target == store.ErrTxConflict }

func (e *conflictError) reason() string {
	if e.code == codeDeadlock {
		return store.RetryDeadlock
	}
	return store.RetrySerialization
}

// SQLSTATEs of a transaction rolled back by a conflict.
const (
	codeSerialization = "40001"
	codeDeadlock      = "40P01"
)
