package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
)

func init() {
	caddy.RegisterModule(QueueAdmin{})
}

// QueueAdmin is the admin API of async mode, on Caddy's admin endpoint
// (module admin.api.webhook_idempotency_queue):
//
//	GET    /webhook_idempotency/queue/                                 every scope: queued, delivering, dead, oldest age
//	GET    /webhook_idempotency/queue/{scope}/events?state=dead&limit=100&after_id=N
//	GET    /webhook_idempotency/queue/{scope}/events/{id}              one event and its attempts
//	POST   /webhook_idempotency/queue/{scope}/events/{id}/retry        a dead event: due now, a fresh round of attempts
//	POST   /webhook_idempotency/queue/{scope}/retry                    every dead event of the scope, the same
//	DELETE /webhook_idempotency/queue/{scope}/events/{id}              purge one event (not while in delivery)
//	DELETE /webhook_idempotency/queue/{scope}/events?state=dead        purge every event in a state (dead, delivered, queued)
//
// Scope and ID are percent-encoded path segments. Answers and errors are
// JSON. Purging removes the queue row only: the event's claim stays, so the
// provider's redelivery is still answered as a duplicate. Bodies are never
// shown.
type QueueAdmin struct{}

// CaddyModule returns the Caddy module information.
func (QueueAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.webhook_idempotency_queue",
		New: func() caddy.Module { return new(QueueAdmin) },
	}
}

const queueAdminPrefix = cli.QueueAdminPrefix

// Routes returns the admin routes.
func (a *QueueAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: queueAdminPrefix, Handler: guardAdmin(queueAdminLogger, a.serve)}}
}

// queueScopes maps each scope of a provisioned async handler to its queue
// backends, so the admin API finds an event's queue.
var queueScopes = newScopeIndex[*queueBackend]()

// QueuedEventJSON is a queued event as the admin API shows it.
type QueuedEventJSON struct {
	ID int64 `json:"id"`
	EventHead
	OrderKey      string        `json:"order_key,omitempty"`
	Attempts      int           `json:"attempts"`
	RoundAttempts int           `json:"round_attempts"`
	Method        string        `json:"method"`
	URI           string        `json:"uri"`
	BodySize      int           `json:"body_size"`
	BodyKept      bool          `json:"body_kept"`
	ReceivedAt    time.Time     `json:"received_at"`
	UpdatedAt     time.Time     `json:"updated_at"`
	NextAttemptAt *time.Time    `json:"next_attempt_at,omitempty"`
	LeaseUntil    *time.Time    `json:"lease_until,omitempty"`
	DeliveredAt   *time.Time    `json:"delivered_at,omitempty"`
	LastStatus    int           `json:"last_status,omitempty"`
	LastError     string        `json:"last_error,omitempty"`
	History       []AttemptJSON `json:"history,omitempty"`
}

// AttemptJSON is one delivery attempt as the admin API shows it.
type AttemptJSON struct {
	Attempt    int        `json:"attempt"`
	Worker     string     `json:"worker"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	DurationMS float64    `json:"duration_ms"`
	Status     int        `json:"status,omitempty"`
	Error      string     `json:"error,omitempty"`
	Outcome    string     `json:"outcome"`
}

// timePtr is t in UTC, or nil when t is zero (the field is then left out of
// the admin API's JSON).
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func queuedEventJSON(e queue.Event) QueuedEventJSON {
	out := QueuedEventJSON{ID: e.ID, EventHead: EventHead{Scope: e.Scope, EventID: e.EventID, State: string(e.State)}, OrderKey: e.OrderKey,
		Attempts: e.Attempts, RoundAttempts: e.RoundAttempts, Method: e.Method, URI: e.URI, BodySize: e.BodySize,
		BodyKept: e.BodyKept, ReceivedAt: e.ReceivedAt.UTC(), UpdatedAt: e.UpdatedAt.UTC(),
		LeaseUntil: timePtr(e.LeaseUntil), DeliveredAt: timePtr(e.DeliveredAt), LastStatus: e.LastStatus, LastError: e.LastError}
	if e.State == queue.StateQueued {
		out.NextAttemptAt = timePtr(e.RunAt)
	}
	return out
}

func (a *QueueAdmin) serve(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimSuffix(strings.TrimPrefix(r.URL.EscapedPath(), queueAdminPrefix), "/")
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if rest == "" {
		if r.Method != http.MethodGet {
			return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
		}
		return a.overview(ctx, w)
	}
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil || u == "" {
			return apiErr(http.StatusBadRequest, "bad path segment %q", p)
		}
		parts[i] = u
	}
	scope := parts[0]
	qbs := queueScopes.lookup(scope)[scope]
	if len(qbs) == 0 {
		return apiErr(http.StatusNotFound, "no async handler has scope %q", scope)
	}
	// {scope}/event?id=I is {scope}/events/I for any ID, also one that
	// cannot be a path segment ("." or "..", "a//b": the admin server's
	// path cleaning would turn it into another resource); the CLI uses it.
	if len(parts) >= 2 && len(parts) <= 3 && parts[1] == "event" {
		id := r.URL.Query().Get("id")
		if id == "" {
			return apiErr(http.StatusBadRequest, "want ?id=<event id>")
		}
		parts = append([]string{scope, "events", id}, parts[2:]...)
	}
	switch {
	case len(parts) == 2 && parts[1] == "retry" && r.Method == http.MethodPost:
		total := 0
		for _, qb := range qbs {
			n, err := qb.q.RetryDead(ctx, scope)
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
			}
			total += n
			qb.d.Poke(scope)
		}
		return writeJSON(w, map[string]any{"scope": scope, "retried": total})
	case len(parts) == 2 && parts[1] == "events":
		return a.events(ctx, w, r, scope, qbs)
	case len(parts) == 3 && parts[1] == "events":
		return a.event(ctx, w, r, scope, parts[2], qbs)
	case len(parts) == 4 && parts[1] == "events" && parts[3] == "retry":
		if r.Method != http.MethodPost {
			return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
		}
		return eachQueue(qbs, func(qb *queueBackend) error {
			err := qb.q.Retry(ctx, scope, parts[2])
			if err == nil {
				qb.d.Poke(scope)
			}
			return err
		}, func() error {
			return writeJSON(w, map[string]any{"scope": scope, "event_id": parts[2], "retried": true})
		})
	}
	return apiErr(http.StatusNotFound, "unknown admin path; see %s{scope}/events", queueAdminPrefix)
}

// eachQueue runs op on each backend until one finds the event, and answers
// with ok, or the error of the refusal.
func eachQueue(qbs []*queueBackend, op func(*queueBackend) error, ok func() error) error {
	for _, qb := range qbs {
		err := op(qb)
		switch {
		case err == nil:
			return ok()
		case errors.Is(err, queue.ErrNotFound):
			continue
		case errors.Is(err, queue.ErrConflict):
			return apiErr(http.StatusConflict, "%v", err)
		default:
			return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
		}
	}
	return apiErr(http.StatusNotFound, "queued event not found")
}

func (a *QueueAdmin) overview(ctx context.Context, w http.ResponseWriter) error {
	type scopeStats struct {
		Scope      string  `json:"scope"`
		Queued     int     `json:"queued"`
		Delivering int     `json:"delivering"`
		Dead       int     `json:"dead"`
		OldestAge  float64 `json:"oldest_age_seconds"`
	}
	out := []scopeStats{}
	for scope, qbs := range queueScopes.lookup("") {
		s := scopeStats{Scope: scope}
		for _, qb := range qbs {
			st, err := qb.q.Stats(ctx, scope)
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
			}
			s.Queued += st.Queued
			s.Delivering += st.Delivering
			s.Dead += st.Dead
			s.OldestAge = max(s.OldestAge, st.OldestAge.Seconds())
		}
		out = append(out, s)
	}
	return writeJSON(w, map[string]any{"scopes": out})
}

func (a *QueueAdmin) events(ctx context.Context, w http.ResponseWriter, r *http.Request, scope string, qbs []*queueBackend) error {
	q := r.URL.Query()
	state := queue.State(q.Get("state"))
	if state != "" && !state.Valid() {
		return apiErr(http.StatusBadRequest, "state: want queued, delivering, delivered or dead")
	}
	switch r.Method {
	case http.MethodGet:
	case http.MethodDelete:
		if state == "" || state == queue.StateDelivering {
			return apiErr(http.StatusBadRequest, "state: purge wants state=dead, delivered or queued")
		}
		total := 0
		for _, qb := range qbs {
			n, err := qb.q.PurgeState(ctx, scope, state)
			total += n
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "queue unavailable after purging %d: %v", total, err)
			}
		}
		return writeJSON(w, map[string]any{"scope": scope, "state": state, "purged": total})
	default:
		return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
	}
	lq := queue.ListQuery{Scope: scope, State: state, Limit: 100}
	n, err := queryLimit(q)
	if err != nil {
		return err
	}
	lq.Limit = n
	if v := q.Get("after_id"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return apiErr(http.StatusBadRequest, "after_id: want the id of the last event of the previous page")
		}
		lq.AfterID = n
	}
	events := []QueuedEventJSON{}
	for _, qb := range qbs {
		evs, err := qb.q.List(ctx, lq)
		if err != nil {
			return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
		}
		for _, e := range evs {
			events = append(events, queuedEventJSON(e))
		}
	}
	out := map[string]any{"events": events}
	if len(events) >= lq.Limit {
		out["next"] = map[string]int64{"after_id": events[len(events)-1].ID}
	}
	return writeJSON(w, out)
}

func (a *QueueAdmin) event(ctx context.Context, w http.ResponseWriter, r *http.Request, scope, id string, qbs []*queueBackend) error {
	switch r.Method {
	case http.MethodGet:
		var ev queue.Event
		var found *queueBackend
		err := eachQueue(qbs, func(qb *queueBackend) error {
			e, err := qb.q.Get(ctx, scope, id)
			ev, found = e, qb
			return err
		}, func() error { return nil })
		if err != nil {
			return err
		}
		out := queuedEventJSON(ev)
		as, err := found.q.Attempts(ctx, ev.ID)
		if err != nil {
			return apiErr(http.StatusServiceUnavailable, "queue unavailable: %v", err)
		}
		for _, a := range as {
			out.History = append(out.History, AttemptJSON{Attempt: a.Attempt, Worker: a.Worker, StartedAt: a.StartedAt.UTC(),
				FinishedAt: timePtr(a.FinishedAt), DurationMS: float64(a.Duration.Microseconds()) / 1000,
				Status: a.Status, Error: a.Error, Outcome: a.Outcome})
		}
		return writeJSON(w, out)
	case http.MethodDelete:
		return eachQueue(qbs, func(qb *queueBackend) error { return qb.q.Purge(ctx, scope, id) }, func() error {
			return writeJSON(w, map[string]any{"scope": scope, "event_id": id, "purged": true})
		})
	}
	return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*QueueAdmin)(nil)
)
