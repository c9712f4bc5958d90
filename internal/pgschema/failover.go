package pgschema

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// serverGoneCodes are the SQLSTATEs that say the server behind a connection
// can no longer take the gateway's writes: it is a standby or a primary made
// read-only (25006 read_only_sql_transaction), or it is shutting down or
// restarting (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now). After a failover every connection of the pool is to
// the old primary, so one such error stands for all of them.
var serverGoneCodes = map[string]bool{
	"25006": true,
	"57P01": true,
	"57P02": true,
	"57P03": true,
}

// resetEvery bounds how often a pool is reset while a server keeps failing.
const resetEvery = time.Second

// PrepareFailover makes a pool config follow a primary that fails over, with
// pgx's own host selection (libpq's multi-host DSNs,
// postgres://h1:5432,h2:5432/db?target_session_attrs=read-write):
//
//   - a DSN naming several hosts without target_session_attrs gets
//     read-write, so a connection never settles on a standby;
//   - a connection that receives a serverGoneCodes error is closed (an ERROR
//     such as 25006 would otherwise leave it in the pool, failing every
//     statement on a standby or a demoted primary), and
//   - on such an error, or a statement that left its connection broken (a
//     reset, an EOF, a FATAL), the pool drops every connection (pgxpool.Pool.Reset, at
//     most once a second), so the next statements dial afresh and find the
//     host that is primary now.
//
// The statement that met the error still fails (the caller answers 503);
// nothing is retried here. Call the returned Watch's Attach with the pool
// built from cfg.
func PrepareFailover(cfg *pgxpool.Config, dsn string) *Watch {
	w := &Watch{}
	cc := cfg.ConnConfig
	if cc.ValidateConnect == nil && !strings.Contains(dsn, "target_session_attrs") && multiHost(cc) {
		cc.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	prev := cc.OnPgError
	cc.OnPgError = func(c *pgconn.PgConn, e *pgconn.PgError) bool {
		if serverGoneCodes[e.Code] {
			w.reset()
			return false
		}
		if prev != nil {
			return prev(c, e)
		}
		return !strings.EqualFold(e.Severity, "FATAL")
	}
	if cc.Tracer == nil {
		cc.Tracer = w
	}
	return w
}

// multiHost reports whether the config names more than one host (pgx keeps
// the second and later hosts, and sslmode=prefer's plain retry, in
// Fallbacks).
func multiHost(cc *pgx.ConnConfig) bool {
	for _, f := range cc.Fallbacks {
		if f.Host != cc.Host || f.Port != cc.Port {
			return true
		}
	}
	return false
}

// Watch resets its pool when a connection meets a failover or is found
// dead (see PrepareFailover and PrepareLiveness).
type Watch struct {
	pool atomic.Pointer[pgxpool.Pool]
	last atomic.Int64 // UnixNano of the last reset
}

// Attach gives w the pool built from the config it prepared.
func (w *Watch) Attach(p *pgxpool.Pool) { w.pool.Store(p) }

// Lost drops every connection of the pool now (at most once a second),
// for a caller that holds none: a statement found its connection dead,
// and the others, idle as long, are presumed dead too (a NAT or load
// balancer that dropped its flows drops them all).
func (w *Watch) Lost() {
	if p := w.due(); p != nil {
		p.Reset()
	}
}

// reset is Lost for a caller that holds a connection of the pool.
func (w *Watch) reset() {
	if p := w.due(); p != nil {
		go p.Reset()
	}
}

// due returns the pool when a reset is due, nil otherwise.
func (w *Watch) due() *pgxpool.Pool {
	p := w.pool.Load()
	if p == nil {
		return nil
	}
	now, last := time.Now().UnixNano(), w.last.Load()
	if now-last < int64(resetEvery) || !w.last.CompareAndSwap(last, now) {
		return nil
	}
	return p
}

// TraceQueryStart implements pgx.QueryTracer.
func (w *Watch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer: a statement that left its
// connection closed (a reset, an EOF, a FATAL from the server), other than
// by the caller's deadline or cancellation, resets the pool.
func (w *Watch) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil || ctx.Err() != nil || !conn.IsClosed() {
		return
	}
	if errors.Is(data.Err, context.Canceled) || errors.Is(data.Err, context.DeadlineExceeded) {
		return
	}
	w.reset()
}
