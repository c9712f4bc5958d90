package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/dispatch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/queuetest"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	pgstore "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
)

// committer is an upstream application on the queue's database: each
// request runs one transaction (its effect, then <table>_commit with the
// Webhook-Claim header), then does what its event's script says.
type committer struct {
	*httptest.Server
	mu     sync.Mutex
	calls  map[string]int
	claims map[string][]string
}

// commitStep is one request's behaviour.
type commitStep struct {
	rollback, noCall bool
	status           int  // answered after the transaction (200 when 0)
	drop             bool // close the connection without answering
}

func newCommitter(t *testing.T, tbl *queuetest.Table, script map[string][]commitStep) *committer {
	ctx := t.Context()
	pool := tbl.Store.Pool()
	_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{tbl.Name + "_effects"}.Sanitize()+` (event_id text NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{tbl.Name + "_effects"}.Sanitize())
	})
	c := &committer{calls: map[string]int{}, claims: map[string][]string{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var ev struct{ ID string }
		_ = json.Unmarshal(b, &ev)
		c.mu.Lock()
		n := c.calls[ev.ID]
		c.calls[ev.ID]++
		c.claims[ev.ID] = append(c.claims[ev.ID], r.Header.Get(dispatch.ClaimHeader))
		c.mu.Unlock()
		var step commitStep
		if s := script[ev.ID]; len(s) > 0 {
			step = s[min(n, len(s)-1)]
		}
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+pgx.Identifier{tbl.Name + "_effects"}.Sanitize()+` VALUES ($1)`, ev.ID); err != nil {
				return err
			}
			if !step.noCall {
				if _, err := tx.Exec(r.Context(), `SELECT `+pgx.Identifier{tbl.Name + "_commit"}.Sanitize()+`($1)`,
					r.Header.Get(dispatch.ClaimHeader)); err != nil {
					return err
				}
			}
			if step.rollback {
				return errors.New("rolled back")
			}
			return nil
		})
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			t.Logf("%s: commit refused: %s", ev.ID, pgErr.Code)
		}
		if step.drop {
			panic(http.ErrAbortHandler) // the connection closes unanswered
		}
		w.WriteHeader(max(step.status, http.StatusOK))
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *committer) callsOf(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[id]
}

// TestCompleteByUpstreamAsync: the dispatcher hands each attempt its
// claim (never a stored one) and settles by the queue row: an upstream
// that committed and then dropped the connection or answered 500 is
// delivered, not retried; one that rolled back is retried and delivers
// once; a 2xx without the commit is delivered and counted as
// delivered_uncommitted. Every event has exactly one effect.
func TestCompleteByUpstreamAsync(t *testing.T) {
	tbl := queuetest.New(t, "dt_", pgstore.Options{}, pgqueue.Options{})
	q := tbl.Queue
	c := newCommitter(t, tbl, map[string][]commitStep{
		"evt_drop":     {{drop: true}},
		"evt_500":      {{status: 500}},
		"evt_rollback": {{rollback: true, status: 500}, {}},
		"evt_forgot":   {{noCall: true}},
	})
	m := testMetrics()
	d := dispatch.New(q, dispatch.Options{Metrics: m, IdlePoll: 20 * time.Millisecond})
	t.Cleanup(d.Stop)

	const scope = "stripe"
	ids := []string{"evt_ok", "evt_drop", "evt_500", "evt_rollback", "evt_forgot"}
	forged := store.QueueClaimValue(scope, "evt_ok", store.NewToken())
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := q.Enqueue(ctx, queue.Entry{
			Scope: scope, EventID: id,
			Request: queue.Request{Method: http.MethodPost, URI: "/hooks",
				Header: http.Header{"Content-Type": {"application/json"}, dispatch.ClaimHeader: {forged}},
				Body:   []byte(`{"id":"` + id + `"}`)},
			Claims: []queue.Key{{Scope: scope, EventID: id}}, ClaimStatus: http.StatusAccepted,
		})
		cancel()
		require.NoError(t, err)
	}
	rt := route(t, scope, c.URL)
	rt.CompleteByUpstream = true
	d.Register(rt).Poke()

	for _, id := range ids {
		waitFor(t, 20*time.Second, id+" delivered", func() bool { return get(t, q, scope, id).State == queue.StateDelivered })
	}
	var effects map[string]int
	rows, err := tbl.Store.Pool().Query(t.Context(), `SELECT event_id, count(*) FROM `+
		pgx.Identifier{tbl.Name + "_effects"}.Sanitize()+` GROUP BY event_id`)
	require.NoError(t, err)
	effects = map[string]int{}
	for rows.Next() {
		var (
			id string
			n  int
		)
		require.NoError(t, rows.Scan(&id, &n))
		effects[id] = n
	}
	require.NoError(t, rows.Err())
	for _, id := range ids {
		require.Equal(t, 1, effects[id], "%s: one effect", id)
	}
	require.Equal(t, 1, c.callsOf("evt_drop"), "committed, answer lost: not retried")
	require.Equal(t, 1, c.callsOf("evt_500"), "committed, answered 500: not retried")
	require.Equal(t, 2, c.callsOf("evt_rollback"), "rolled back: retried")
	c.mu.Lock()
	for id, claims := range c.claims {
		for _, v := range claims {
			require.NotEqual(t, forged, v, "%s: a stored Webhook-Claim never reaches the upstream", id)
			_, eventID, _, queued, ok := store.ParseAnyClaimValue(v)
			require.True(t, ok && queued && eventID == id, "%s: its own queue claim", id)
		}
	}
	c.mu.Unlock()
	// Counted once each attempt's settle has returned, after its row changed.
	counts := func() [3]float64 {
		return [3]float64{value(t, m.Attempts.WithLabelValues(scope, dispatch.AttemptUncommitted)),
			value(t, m.Attempts.WithLabelValues(scope, queue.AttemptDelivered)),
			value(t, m.Attempts.WithLabelValues(scope, queue.AttemptRetry))}
	}
	waitFor(t, 10*time.Second, "every attempt counted", func() bool { return counts() == [3]float64{1, 4, 1} })
}

// TestClaimHeaderStrippedAsync: on a route without complete_by upstream, a
// Webhook-Claim stored with the request is not forwarded.
func TestClaimHeaderStrippedAsync(t *testing.T) {
	q := newQueue(t)
	u := newUpstream(t, nil)
	d := dispatch.New(q, dispatch.Options{IdlePoll: 20 * time.Millisecond})
	t.Cleanup(d.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := q.Enqueue(ctx, queue.Entry{
		Scope: "s", EventID: "evt_1",
		Request: queue.Request{Method: http.MethodPost, URI: "/",
			Header: http.Header{dispatch.ClaimHeader: {"forged"}}, Body: []byte(`{"id":"evt_1"}`)},
		Claims: []queue.Key{{Scope: "s", EventID: "evt_1"}}, ClaimStatus: http.StatusAccepted,
	})
	require.NoError(t, err)
	d.Register(route(t, "s", u.URL)).Poke()
	waitFor(t, 20*time.Second, "delivered", func() bool { return get(t, q, "s", "evt_1").State == queue.StateDelivered })
	u.mu.Lock()
	defer u.mu.Unlock()
	require.Empty(t, u.headers["evt_1"].Values(dispatch.ClaimHeader))
}
