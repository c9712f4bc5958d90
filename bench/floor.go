package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// Mode floor sets PostgreSQL's CPU per new event of the gateway's own
// batch statements (<table>_claim, then the batched completion, each
// planned per execution as the store runs them) beside the plainest
// statements that write the same rows: a multi-row INSERT ... ON
// CONFLICT DO NOTHING with no arbitration (no read, no answer per key)
// and the same completion with a cached plan. Both run on one table made
// by the real migrations, prefilled and analyzed so the cached plans are
// good ones, from floorClients connections, floorKeys keys a batch, each
// batch two transactions (a claim, then its completion) as the gateway
// writes them; rounds alternate the two. CPU is that of the run's own
// backends, read from /proc.
const (
	floorTable   = "bench_floor"
	floorClients = 8
	// floorKeys is about the gateway's batch at c=32: its claim statements
	// carried 11 keys on average in the load run of 2026-12-03, its
	// transactions 19 claims and completions.
	floorKeys    = 13
	floorPrefill = 50_000
)

// FloorReport is the JSON of a floor run.
type FloorReport struct {
	Started time.Time          `json:"started"`
	Command string             `json:"command"`
	Machine MachineInfo        `json:"machine"`
	Clients int                `json:"clients"`
	Keys    int                `json:"keys_per_batch"`
	Rounds  []FloorRound       `json:"rounds"`
	Median  map[string]float64 `json:"median_us_per_event"`
}

// FloorRound is one slice of one variant.
type FloorRound struct {
	Variant     string  `json:"variant"`
	Events      int64   `json:"events"`
	MicrosEvent float64 `json:"postgres_cpu_us_per_event"`
}

func runFloor(ctx context.Context, c config) (*FloorReport, error) {
	st, err := openStore(ctx, c.dsn, floorTable)
	if err != nil {
		return nil, err
	}
	defer dropStore(st, floorTable)
	claim, complete, err := postgres.BatchStatements(floorTable)
	if err != nil {
		return nil, err
	}
	insert := `INSERT INTO ` + floorTable + ` (scope, event_id, state, token, attempts, lease_until, first_seen, updated_at)
		SELECT u.scope, u.event_id, 'processing', u.token, 1, now() + u.lease * interval '1 microsecond', now(), now()
			FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS u(scope, event_id, token, lease)
		ON CONFLICT (scope, event_id) DO NOTHING`
	// A cached plan made on an empty table keeps a sequential scan for the
	// completion (the reason the store plans it per execution): the floor
	// gets the table its plans are best on.
	if _, err := st.Pool().Exec(ctx, `INSERT INTO `+floorTable+` (scope, event_id, state, completed_at, status)
		SELECT 'stripe', 'evt_prefill_' || g, 'completed', now(), 200 FROM generate_series(1, $1::int) g`, floorPrefill); err != nil {
		return nil, err
	}
	if _, err := st.Pool().Exec(ctx, `ANALYZE `+floorTable); err != nil {
		return nil, err
	}
	rep := &FloorReport{Started: time.Now().UTC(), Command: strings.Join(os.Args, " "), Machine: machineInfo(ctx, st),
		Clients: floorClients, Keys: floorKeys, Median: map[string]float64{}}
	variants := []struct {
		name  string
		mode  pgx.QueryExecMode
		claim string
		hold  *bool
	}{
		{"gateway", pgx.QueryExecModeCacheDescribe, claim, new(bool)},
		{"floor", pgx.QueryExecModeCacheStatement, insert, nil},
	}
	slice := c.duration / time.Duration(c.rounds)
	per := map[string][]float64{}
	var seq atomic.Int64
	for round := range c.rounds {
		for k := range variants {
			v := variants[(k+round)%len(variants)]
			r, err := floorSlice(ctx, c.dsn, v.mode, v.claim, v.hold, complete, slice, &seq)
			if err != nil {
				return rep, fmt.Errorf("%s: %w", v.name, err)
			}
			r.Variant = v.name
			rep.Rounds = append(rep.Rounds, r)
			per[v.name] = append(per[v.name], r.MicrosEvent)
			fmt.Printf("  round %d %-8s %8d events  %6.1f µs PostgreSQL CPU per event\n", round+1, v.name, r.Events, r.MicrosEvent)
		}
	}
	for name, v := range per {
		rep.Median[name] = medianF(v) // the lower of the two middle rounds of an even count
	}
	rep.Machine.LoadAfter = loadavg()
	fmt.Printf("\nPostgreSQL CPU per new event, median of %d rounds (ranges above): gateway %.1f µs, floor %.1f µs (target ≤ 40 µs)\n",
		c.rounds, rep.Median["gateway"], rep.Median["floor"])
	return rep, nil
}

// floorSlice drives floorClients connections of their own for du, each
// claiming floorKeys new event IDs with claimSQL and completing them, and
// returns the CPU their backends spent per event.
func floorSlice(ctx context.Context, dsn string, mode pgx.QueryExecMode, claimSQL string, hold *bool, completeSQL string, du time.Duration, seq *atomic.Int64) (FloorRound, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return FloorRound{}, err
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns, cfg.MinConns = floorClients, floorClients
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return FloorRound{}, err
	}
	defer pool.Close()
	conns := make([]*pgxpool.Conn, 0, floorClients)
	// Released before the pool closes, which waits for every connection.
	defer func() {
		for _, conn := range conns {
			conn.Release()
		}
	}()
	pids := make([]int, floorClients)
	for n := range floorClients {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return FloorRound{}, err
		}
		conns = append(conns, conn)
		pids[n] = int(conn.Conn().PgConn().PID())
	}
	ticks := func() (t int64) {
		for _, p := range pids {
			t += cpuTicks(p)
		}
		return t
	}
	for _, p := range pids {
		// A backend's process title starts "postgres:".
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); err != nil || !bytes.HasPrefix(b, []byte("postgres")) {
			return FloorRound{}, errors.New("the backends' CPU is read from /proc: the PostgreSQL server must run on this machine")
		}
	}
	before := ticks()
	// Batches stop being started at the deadline; none is cut short, so
	// every backend is still there when its CPU is read.
	deadline := time.Now().Add(du)
	var (
		events atomic.Int64
		wg     sync.WaitGroup
		mu     sync.Mutex
		fatal  error
	)
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := floorClient(ctx, deadline, conn.Conn(), claimSQL, hold, completeSQL, seq, &events); err != nil {
				mu.Lock()
				fatal = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	spent := ticks() - before
	if fatal != nil {
		return FloorRound{}, fatal
	}
	n := events.Load()
	if n == 0 {
		return FloorRound{}, fmt.Errorf("no batch finished in %s", du)
	}
	return FloorRound{Events: n, MicrosEvent: float64(spent) * 1e6 / float64(clockTicks) / float64(n)}, nil
}

// floorClient claims and completes batches of new event IDs on conn until
// the deadline (or ctx ends); every key of every batch must be claimed and
// completed. hold is <table>_claim's last argument; nil for the plain
// INSERT.
func floorClient(ctx context.Context, deadline time.Time, conn *pgx.Conn, claimSQL string, hold *bool, completeSQL string, seq, events *atomic.Int64) error {
	scopes, ids, tokens := make([]string, floorKeys), make([]string, floorKeys), make([]string, floorKeys)
	leases, statuses := make([]int64, floorKeys), make([]int32, floorKeys)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		for k := range ids {
			n := seq.Add(1)
			scopes[k], ids[k], tokens[k] = "stripe", fmt.Sprintf("evt_floor_%012d", n), fmt.Sprintf("tok_%d", n)
			leases[k], statuses[k] = 30_000_000, 200
		}
		// IDs rise within a batch: its row locks are taken in key order, as
		// the store sorts them.
		args := []any{scopes, ids, tokens, leases}
		if hold != nil {
			args = append(args, *hold)
		}
		if _, err := conn.Exec(ctx, claimSQL, args...); err != nil {
			return err
		}
		tag, err := conn.Exec(ctx, completeSQL, scopes, ids, tokens, statuses)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != floorKeys {
			return fmt.Errorf("a batch completed %d of %d claims", tag.RowsAffected(), floorKeys)
		}
		events.Add(floorKeys)
	}
	return nil
}
