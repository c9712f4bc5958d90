package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin is the admin API of the gateway, on Caddy's admin endpoint
// (module admin.api.webhook_idempotency, loaded with the admin endpoint):
//
//	GET    /webhook_idempotency/events/{scope}/{id}   one event: state, attempts, first seen, completed at, status
//	GET    /webhook_idempotency/events?state=processing&older_than=5m&scope=stripe&limit=100&after_scope=..&after_id=..
//	DELETE /webhook_idempotency/events/{scope}/{id}   forget the event: the provider's next delivery is forwarded again
//
// Scope and ID are path segments, percent-encoded as needed. Answers and
// errors are JSON ({"error": "..."}). A forgotten event is dropped from this
// instance's cache at once; other instances may answer it from their caches
// as a duplicate for at most cacheTTL (1 minute).
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.webhook_idempotency",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (a *Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminPrefix, Handler: caddy.AdminHandlerFunc(a.serve)}}
}

const adminPrefix = "/webhook_idempotency/"

// scopes maps each scope of a provisioned handler to its backends, so the
// admin API finds the store of an event. Several handlers (and, during a
// reload, two configs) may register the same scope.
var scopes = struct {
	sync.Mutex
	m map[string]map[*backend]int
}{m: map[string]map[*backend]int{}}

func registerScope(scope string, b *backend) {
	scopes.Lock()
	defer scopes.Unlock()
	if scopes.m[scope] == nil {
		scopes.m[scope] = map[*backend]int{}
	}
	scopes.m[scope][b]++
}

func unregisterScope(scope string, b *backend) {
	scopes.Lock()
	defer scopes.Unlock()
	if n := scopes.m[scope][b]; n > 1 {
		scopes.m[scope][b] = n - 1
		return
	}
	delete(scopes.m[scope], b)
	if len(scopes.m[scope]) == 0 {
		delete(scopes.m, scope)
	}
}

// backendsFor returns the backends of a scope, or of every scope when scope
// is "".
func backendsFor(scope string) []*backend {
	scopes.Lock()
	defer scopes.Unlock()
	seen := map[*backend]bool{}
	var out []*backend
	for s, bs := range scopes.m {
		if scope != "" && s != scope {
			continue
		}
		for b := range bs {
			if !seen[b] {
				seen[b] = true
				out = append(out, b)
			}
		}
	}
	return out
}

// EventJSON is an event as the admin API shows it.
type EventJSON struct {
	Scope       string     `json:"scope"`
	EventID     string     `json:"event_id"`
	State       string     `json:"state"`
	Attempts    int        `json:"attempts"`
	FirstSeen   time.Time  `json:"first_seen"`
	UpdatedAt   time.Time  `json:"updated_at"`
	LeaseUntil  *time.Time `json:"lease_until,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	Status      int        `json:"status,omitempty"`
}

func toJSON(e store.Event) EventJSON {
	out := EventJSON{Scope: e.Scope, EventID: e.EventID, State: string(e.State), Attempts: e.Attempts,
		FirstSeen: e.FirstSeen.UTC(), UpdatedAt: e.UpdatedAt.UTC(), Status: e.Status}
	if !e.LeaseUntil.IsZero() {
		t := e.LeaseUntil.UTC()
		out.LeaseUntil = &t
	}
	if !e.CompletedAt.IsZero() {
		t := e.CompletedAt.UTC()
		out.CompletedAt = &t
	}
	return out
}

func apiErr(status int, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return caddy.APIError{HTTPStatus: status, Err: errors.New(msg), Message: msg}
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

func (a *Admin) serve(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), adminPrefix)
	parts := strings.Split(rest, "/")
	if len(parts) == 0 || parts[0] != "events" {
		return apiErr(http.StatusNotFound, "unknown admin path; see /webhook_idempotency/events")
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if len(parts) == 1 || (len(parts) == 2 && parts[1] == "") {
		if r.Method != http.MethodGet {
			return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
		}
		return a.list(ctx, w, r)
	}
	if len(parts) != 3 {
		return apiErr(http.StatusNotFound, "want /webhook_idempotency/events/{scope}/{id}")
	}
	scope, err1 := url.PathUnescape(parts[1])
	id, err2 := url.PathUnescape(parts[2])
	if err1 != nil || err2 != nil || scope == "" || id == "" {
		return apiErr(http.StatusBadRequest, "bad scope or event id in path")
	}
	bs := backendsFor(scope)
	if len(bs) == 0 {
		return apiErr(http.StatusNotFound, "no handler has scope %q", scope)
	}
	switch r.Method {
	case http.MethodGet:
		for _, b := range bs {
			e, err := b.Get(ctx, scope, id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "event store unavailable: %v", err)
			}
			return writeJSON(w, toJSON(e))
		}
		return apiErr(http.StatusNotFound, "event not found")
	case http.MethodDelete:
		found := false
		for _, b := range bs {
			err := b.Forget(ctx, scope, id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return apiErr(http.StatusServiceUnavailable, "event store unavailable: %v", err)
			}
			b.completed.Forget(scope, id)
			found = true
		}
		if !found {
			return apiErr(http.StatusNotFound, "event not found")
		}
		return writeJSON(w, map[string]any{"forgotten": true, "scope": scope, "event_id": id})
	}
	return apiErr(http.StatusMethodNotAllowed, "method %s not allowed", r.Method)
}

func (a *Admin) list(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	lq := store.ListQuery{
		State:      store.State(q.Get("state")),
		Scope:      q.Get("scope"),
		AfterScope: q.Get("after_scope"),
		AfterID:    q.Get("after_id"),
		Limit:      100,
	}
	switch lq.State {
	case "", store.StateProcessing, store.StateCompleted, store.StateReleased, store.StateHeld:
	default:
		return apiErr(http.StatusBadRequest, "state: want processing, completed, released or held")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return apiErr(http.StatusBadRequest, "limit: want 1..1000")
		}
		lq.Limit = n
	}
	if v := q.Get("older_than"); v != "" {
		d, err := caddy.ParseDuration(v)
		if err != nil || d < 0 {
			return apiErr(http.StatusBadRequest, "older_than: want a duration such as 5m")
		}
		lq.OlderThan = time.Now().Add(-d)
	}
	events := []EventJSON{}
	for _, b := range backendsFor(lq.Scope) {
		es, err := b.List(ctx, lq)
		if err != nil {
			return apiErr(http.StatusServiceUnavailable, "event store unavailable: %v", err)
		}
		for _, e := range es {
			events = append(events, toJSON(e))
		}
	}
	out := map[string]any{"events": events}
	if len(events) >= lq.Limit {
		last := events[len(events)-1]
		out["next"] = map[string]string{"after_scope": last.Scope, "after_id": last.EventID}
	}
	return writeJSON(w, out)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*Admin)(nil)
)
