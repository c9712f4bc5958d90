package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/pgschema"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// batchQueries are the statements of WriteBatch: each takes a whole batch
// as arrays and its results come back by position.
type batchQueries struct {
	claim, complete, release, hold string
	// claimOne is claim for a batch of one, on scalars.
	claimOne string
}

// buildBatchQueries builds the batch statements on the table ident.
func buildBatchQueries(ident pgx.Identifier) batchQueries {
	t, fn := ident.Sanitize(), claimFunction(ident)
	return batchQueries{
		// $1 scopes, $2 event IDs, $3 tokens, $4 leases in microseconds, $5
		// hold (the batch is split by it), keys sorted: <table>_claim.
		claim: `SELECT * FROM ` + fn + `($1::text[], $2::text[], $3::text[], $4::bigint[], $5::boolean)`,
		// claim for one row: $1 scope, $2 event ID, $3 token, $4 lease in
		// microseconds, $5 hold; the same columns.
		claimOne: `SELECT * FROM ` + fn + `(ARRAY[$1::text], ARRAY[$2::text], ARRAY[$3::text], ARRAY[$4::bigint], $5::boolean)`,
		// $1 scopes, $2 event IDs, $3 tokens, $4 statuses; returns the
		// positions of the rows changed. The settles find their rows by
		// primary key: "e.state || ''" keeps the planner off the (state,
		// updated_at) index, which it otherwise picks for a batch of 30 or
		// more on an unanalyzed table and then reads every dead
		// 'processing' entry since the last vacuum (7 ms instead of 0.5 ms
		// for 30 rows on a table of 30,000, in EXPLAIN ANALYZE).
		complete: `UPDATE ` + t + ` AS e SET state = 'completed', status = i.status, token = '', lease_until = NULL,
				completed_at = now(), updated_at = now()
			FROM unnest($1::text[], $2::text[], $3::text[], $4::int[]) WITH ORDINALITY AS i(scope, event_id, token, status, ord)
			WHERE e.scope = i.scope AND e.event_id = i.event_id AND e.token = i.token AND e.state || '' = 'processing'
			RETURNING i.ord`,
		release: `UPDATE ` + t + ` AS e SET state = 'released', token = '', lease_until = NULL, updated_at = now()
			FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS i(scope, event_id, token, ord)
			WHERE e.scope = i.scope AND e.event_id = i.event_id AND e.token = i.token AND e.state || '' = 'processing'
			RETURNING i.ord`,
		// $1 scopes, $2 event IDs, $3 tokens, $4 reasons.
		hold: `UPDATE ` + t + ` AS e SET state = 'held', token = '', lease_until = NULL, updated_at = now(),
				hold_reason = i.reason, ambiguous = e.ambiguous + 1
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS i(scope, event_id, token, reason, ord)
			WHERE e.scope = i.scope AND e.event_id = i.event_id AND e.token = i.token AND e.state || '' = 'processing'
			RETURNING i.ord`,
	}
}

// BatchStatements are the statements a batch of claims and a batch of
// completions run on table ("schema.name" or "name"): claim takes $1
// scopes, $2 event IDs, $3 tokens, $4 leases in microseconds and $5 hold,
// complete takes $1 scopes, $2 event IDs, $3 tokens and $4 statuses. For
// the benchmark's floor run, which sets them beside the plainest
// statements that write the same rows.
func BatchStatements(table string) (claim, complete string, err error) {
	t, err := store.ParseTable(table)
	if err != nil {
		return "", "", err
	}
	q := buildBatchQueries(pgschema.Ident(t))
	return q.claim, q.complete, nil
}

var _ store.BatchDriver = driver{}

// compareKeys orders rows by (scope, event ID): every batch takes its row
// locks in this order, so two gateways' batches wait for each other
// instead of deadlocking.
func compareKeys(scopeA, idA, scopeB, idB string) int {
	if c := strings.Compare(scopeA, scopeB); c != 0 {
		return c
	}
	return strings.Compare(idA, idB)
}

// smallBatch is the most operations WriteBatch writes with the one-row
// statements (pipelined, one commit) instead of the array statements: a
// claim and a completion arriving together, the common batch of a lone
// sender, would otherwise pay the planning of the array statements for
// two rows (PostgreSQL's CPU per delivery at one in flight: 1.6 ms with
// the array statements, 0.3 ms with one-row ones).
const smallBatch = 4

// claimOneArgs are batch.claimOne's arguments for c.
func claimOneArgs(c *store.BatchClaim) []any {
	return []any{c.Scope, c.EventID, c.Token, leaseMicros(c.Lease), c.Hold}
}

// scanClaimOne reads batch.claimOne's row into c.
func scanClaimOne(r pgx.Row, c *store.BatchClaim) error {
	var (
		state  string
		micros int64
	)
	err := r.Scan(&c.Claimed, &c.Attempts, &state, &c.Status, &micros, &c.Ambiguous)
	c.State, c.LeaseLeft = store.State(state), time.Duration(micros)*time.Microsecond
	return err
}

// writeSmall writes a batch of at most smallBatch operations with the
// one-row statements, as one pipelined pgx batch (one round trip, one
// implicit transaction, one commit); claims first, then settles, each in
// key order as the array statements take their row locks.
func (d driver) writeSmall(ctx context.Context, b *store.Batch) error {
	claims := make([]int, len(b.Claims))
	for n := range claims {
		claims[n] = n
	}
	slices.SortFunc(claims, func(x, y int) int {
		return compareKeys(b.Claims[x].Scope, b.Claims[x].EventID, b.Claims[y].Scope, b.Claims[y].EventID)
	})
	settles := make([]int, len(b.Settles))
	for n := range settles {
		settles[n] = n
	}
	slices.SortFunc(settles, func(x, y int) int {
		return compareKeys(b.Settles[x].Scope, b.Settles[x].EventID, b.Settles[y].Scope, b.Settles[y].EventID)
	})
	var pb pgx.Batch
	for _, n := range claims {
		pb.Queue(d.q.batch.claimOne, claimOneArgs(&b.Claims[n])...)
	}
	if err := checkSettles(b); err != nil {
		return err
	}
	for _, n := range settles {
		pb.Queue(d.q.stmts[b.Settles[n].Stmt], store.SettleArgs(&b.Settles[n])...)
	}
	br := d.db.SendBatch(ctx, &pb)
	for _, n := range claims {
		if err := scanClaimOne(br.QueryRow(), &b.Claims[n]); err != nil {
			_ = br.Close()
			return interpretError(err)
		}
	}
	for _, n := range settles {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return interpretError(err)
		}
		b.Settles[n].Changed = tag.RowsAffected() > 0
	}
	return interpretError(br.Close())
}

// checkSettles refuses a settle whose statement is not one a batch writes.
func checkSettles(b *store.Batch) error {
	for _, s := range b.Settles {
		if s.Stmt != store.StmtComplete && s.Stmt != store.StmtRelease && s.Stmt != store.StmtHold {
			return fmt.Errorf("batch: statement %d is not a batched settle", s.Stmt)
		}
	}
	return nil
}

// keyColumns are the scope, event ID and token columns of the batch
// statements' arrays, for the rows idx (in their order), read by at.
func keyColumns(idx []int, at func(n int) (scope, id, token string)) (scopes, ids, tokens []string) {
	scopes, ids, tokens = make([]string, len(idx)), make([]string, len(idx)), make([]string, len(idx))
	for k, n := range idx {
		scopes[k], ids[k], tokens[k] = at(n)
	}
	return scopes, ids, tokens
}

// WriteBatch sends b's statements (at most one claim statement per hold
// value, one complete, one release, one hold) as one pipelined pgx batch: a single
// round trip and one implicit transaction (one Sync), so one commit. The
// driver's run bounds it and runs it again when the database rolled it
// back for a conflict (the claims keep their tokens).
func (d driver) WriteBatch(ctx context.Context, b *store.Batch) error {
	return d.run.Run(ctx, func(ctx context.Context) error { return d.writeBatch(ctx, b) })
}

func (d driver) writeBatch(ctx context.Context, b *store.Batch) error {
	if len(b.Claims) == 0 && len(b.Settles) == 1 {
		// A lone settle: the one-row statement, cheaper to plan and run.
		s := &b.Settles[0]
		tag, err := d.db.Exec(ctx, d.q.stmts[s.Stmt], convert(store.SettleArgs(s))...)
		s.Changed = tag.RowsAffected() > 0
		return interpretError(err)
	}
	if len(b.Claims) == 1 && len(b.Settles) == 0 {
		// A lone claim: the one-row statement, cheaper to plan and run.
		c := &b.Claims[0]
		return interpretError(scanClaimOne(d.db.QueryRow(ctx, d.q.batch.claimOne, claimOneArgs(c)...), c))
	}
	if len(b.Claims)+len(b.Settles) <= smallBatch {
		return d.writeSmall(ctx, b)
	}
	var (
		pb     pgx.Batch
		reads  []func(pgx.Rows) error
		groups [2][]int // claim positions by hold
	)
	for n, c := range b.Claims {
		h := 0
		if c.Hold {
			h = 1
		}
		groups[h] = append(groups[h], n)
	}
	for h, idx := range groups {
		if len(idx) == 0 {
			continue
		}
		slices.SortFunc(idx, func(x, y int) int {
			return compareKeys(b.Claims[x].Scope, b.Claims[x].EventID, b.Claims[y].Scope, b.Claims[y].EventID)
		})
		scopes, ids, tokens := keyColumns(idx, func(n int) (string, string, string) {
			c := &b.Claims[n]
			return c.Scope, c.EventID, c.Token
		})
		leases := make([]int64, len(idx))
		for k, n := range idx {
			leases[k] = leaseMicros(b.Claims[n].Lease)
		}
		pb.Queue(d.q.batch.claim, scopes, ids, tokens, leases, h == 1)
		reads = append(reads, func(rows pgx.Rows) error {
			defer rows.Close()
			k := 0
			for rows.Next() {
				if k >= len(idx) {
					break
				}
				c := &b.Claims[idx[k]]
				var (
					state  string
					micros int64
				)
				if err := rows.Scan(&c.Claimed, &c.Attempts, &state, &c.Status, &micros, &c.Ambiguous); err != nil {
					return err
				}
				c.State, c.LeaseLeft = store.State(state), time.Duration(micros)*time.Microsecond
				k++
			}
			return rows.Err()
		})
	}
	if err := checkSettles(b); err != nil {
		return err
	}
	for _, stmt := range [...]store.Stmt{store.StmtComplete, store.StmtRelease, store.StmtHold} {
		var idx []int
		for n, s := range b.Settles {
			if s.Stmt == stmt {
				idx = append(idx, n)
			}
		}
		if len(idx) == 0 {
			continue
		}
		slices.SortFunc(idx, func(x, y int) int {
			return compareKeys(b.Settles[x].Scope, b.Settles[x].EventID, b.Settles[y].Scope, b.Settles[y].EventID)
		})
		scopes, ids, tokens := keyColumns(idx, func(n int) (string, string, string) {
			s := &b.Settles[n]
			return s.Scope, s.EventID, s.Token
		})
		switch stmt {
		case store.StmtComplete:
			statuses := make([]int32, len(idx))
			for k, n := range idx {
				statuses[k] = int32(b.Settles[n].Status)
			}
			pb.Queue(d.q.batch.complete, scopes, ids, tokens, statuses)
		case store.StmtHold:
			reasons := make([]string, len(idx))
			for k, n := range idx {
				reasons[k] = b.Settles[n].Reason
			}
			pb.Queue(d.q.batch.hold, scopes, ids, tokens, reasons)
		default:
			pb.Queue(d.q.batch.release, scopes, ids, tokens)
		}
		reads = append(reads, func(rows pgx.Rows) error {
			defer rows.Close()
			for rows.Next() {
				var ord int64
				if err := rows.Scan(&ord); err != nil {
					return err
				}
				if ord >= 1 && int(ord) <= len(idx) {
					b.Settles[idx[ord-1]].Changed = true
				}
			}
			return rows.Err()
		})
	}
	switch len(reads) {
	case 0:
		return nil
	case 1:
		// One statement needs no pipeline: its own implicit transaction.
		q := pb.QueuedQueries[0]
		rows, err := d.db.Query(ctx, q.SQL, q.Arguments...)
		if err != nil {
			return interpretError(err)
		}
		return interpretError(reads[0](rows))
	}
	br := d.db.SendBatch(ctx, &pb)
	for _, read := range reads {
		rows, err := br.Query()
		if err == nil {
			err = read(rows)
		}
		if err != nil {
			_ = br.Close()
			return interpretError(err)
		}
	}
	return interpretError(br.Close())
}
