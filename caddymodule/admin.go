package caddymodule

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin is the admin API of the gateway, on Caddy's admin endpoint
// (module admin.api.webhook_idempotency, loaded with the admin endpoint):
//
//	GET    /webhook_idempotency/events/{scope}/{id}           one event: state, attempts, first seen, completed at, status, why it is held
//	GET    /webhook_idempotency/events?state=processing&older_than=5m&scope=stripe&limit=100
//	       [&after_updated_at=..&after_scope=..&after_id=..]  a page of events, oldest update first; "next" is the next page's cursor
//	DELETE /webhook_idempotency/events/{scope}/{id}           forget the event: the provider's next delivery is forwarded again
//	POST   /webhook_idempotency/events/{scope}/{id}/release   a held event, or a claim whose lease expired: the next delivery is forwarded
//	POST   /webhook_idempotency/events/{scope}/{id}/complete  the same, but later deliveries are answered as duplicates
//	GET    /webhook_idempotency/spool                         each open spool: waiting deliveries, bytes, oldest age, counts, the first 100 waiting
//
// Scope and ID are path segments, percent-encoded as needed; the body-hash
// rows of dedupe_body live in scope "<scope>#body" ("%23body" in a path).
// Answers and errors are JSON ({"error": "..."}): 404 for an unknown scope,
// event or path, 400 for a bad parameter, 405 for a wrong method, 409 when
// release or complete meets an event that is not held or stuck, 503 when the
// store fails. A forgotten, released or completed event is dropped from this
// instance's cache at once; other instances may answer it from their caches
// as a duplicate for at most cacheTTL (1 minute).
type Admin struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.webhook_idempotency",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Provision sets up the admin API's logger: operator actions are logged.
func (a *Admin) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger(a) // the admin context has no module of its own
	return nil
}

// Routes returns the admin routes.
func (a *Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminPrefix, Handler: guardAdmin(a.log0, a.serve)}}
}

const adminPrefix = cli.AdminPrefix

// scopes maps each scope of a provisioned handler to its backends, so the
// admin API finds the store of an event.
var scopes = newScopeIndex[*backend]()

// scopeTrusts maps each scope of a provisioned handler to how its routes
// verify (Handler.trust), for GET /webhook_idempotency/scopes: an operator
// compares them across instances that share a database.
var scopeTrusts = newScopeIndex[string]()

// ScopeJSON is a scope as GET /webhook_idempotency/scopes shows it.
type ScopeJSON struct {
	Scope string `json:"scope"`
	// Verifiers lists how the scope's routes in this process turn a
	// request into a claim: provider, scheme, a fingerprint of the
	// secrets (never a secret), event ID source. One entry unless a
	// reload is under way.
	Verifiers []string `json:"verifiers"`
}

// listScopes answers GET /webhook_idempotency/scopes.
func (a *Admin) listScopes(w http.ResponseWriter) error {
	out := []ScopeJSON{}
	for scope, trusts := range scopeTrusts.lookup("") {
		slices.Sort(trusts)
		out = append(out, ScopeJSON{Scope: scope, Verifiers: trusts})
	}
	slices.SortFunc(out, func(a, b ScopeJSON) int { return strings.Compare(a.Scope, b.Scope) })
	return writeJSON(w, map[string]any{"scopes": out})
}

// backendsFor returns the backends of a scope, or of every scope when scope
// is "". A body-hash scope ("<scope>#body") has the backends of its scope.
func backendsFor(scope string) []*backend {
	seen := map[*backend]bool{}
	var out []*backend
	for _, bs := range scopes.lookup(strings.TrimSuffix(scope, bodyScopeSuffix)) {
		for _, b := range bs {
			if !seen[b] {
				seen[b] = true
				out = append(out, b)
			}
		}
	}
	return out
}

// EventHead is what the admin API shows first of an event, stored
// (EventJSON) or queued (QueuedEventJSON).
type EventHead struct {
	Scope   string `json:"scope"`
	EventID string `json:"event_id"`
	State   string `json:"state"`
}

// EventJSON is an event as the admin API shows it.
type EventJSON struct {
	EventHead
	Attempts    int        `json:"attempts"`
	FirstSeen   time.Time  `json:"first_seen"`
	UpdatedAt   time.Time  `json:"updated_at"`
	LeaseUntil  *time.Time `json:"lease_until,omitempty"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
	Status      int        `json:"status,omitempty"`
	// HoldReason says why a held event is held (on_ambiguous hold): how
	// its forward ended, or that its claim's lease expired. Omitted unless
	// held, and for events held by a version that recorded no reason.
	HoldReason string `json:"hold_reason,omitempty"`
	// Ambiguous counts the event's forwards that ended with no known
	// outcome (released under on_ambiguous reforward, held, or cut by a
	// gateway's exit or death); the upstream may have run each. A completed
	// event with ambiguous > 0 may have run more than once. Omitted when 0.
	Ambiguous int `json:"ambiguous,omitempty"`
	// Response describes the stored answer (replay response, provider
	// idempotency_key): its size and SHA-256, never its content.
	Response *ResponseJSON `json:"response,omitempty"`
}

// ResponseJSON is a stored answer as the admin API shows it.
type ResponseJSON struct {
	// BodyStored is false when only status and headers were stored.
	BodyStored bool `json:"body_stored"`
	// BodyNotStored says why the body is not stored: "cut" (cut before its
	// end: what arrived of it is not the upstream's answer, so it has no
	// size or hash either) or "too_large" (larger than replay_max).
	// Omitted when the body is stored.
	BodyNotStored string `json:"body_not_stored,omitempty"`
	// Size (bytes) and SHA256 (hex) describe the upstream's whole body,
	// stored or not; omitted when it was cut.
	Size   *int64 `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

func toJSON(e store.Event) EventJSON {
	out := EventJSON{EventHead: EventHead{Scope: e.Scope, EventID: e.EventID, State: string(e.State)}, Attempts: e.Attempts,
		FirstSeen: e.FirstSeen.UTC(), UpdatedAt: e.UpdatedAt.UTC(), Status: e.Status, HoldReason: e.HoldReason,
		Ambiguous: e.Ambiguous, LeaseUntil: timePtr(e.LeaseUntil), CompletedAt: timePtr(e.CompletedAt)}
	if r := e.Response; r.Stored {
		out.Response = &ResponseJSON{BodyStored: r.BodyStored}
		switch {
		case r.Cut:
			out.Response.BodyNotStored = "cut"
		case !r.BodyStored:
			out.Response.BodyNotStored = "too_large"
		}
		if !r.Cut {
			out.Response.Size, out.Response.SHA256 = &r.Size, r.SHA256
		}
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

// bodyScopeSuffix marks the scope of dedupe_body's body-hash rows.
const bodyScopeSuffix = "#body"

func (a *Admin) serve(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), adminPrefix)
	parts := strings.Split(rest, "/")
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	switch {
	case parts[0] == "scopes" && len(parts) == 1:
		if err := allow(w, r, http.MethodGet); err != nil {
			return err
		}
		return a.listScopes(w)
	case parts[0] == "secrets":
		return a.serveSecrets(ctx, w, r, parts) // secretsadmin.go
	case parts[0] == "event" && len(parts) <= 2:
		// The event named by query parameters: any ID, also one that
		// cannot be a path segment ("." or "..", or one with "/" or "//",
		// which the admin server's path cleaning would turn into another
		// resource). The CLI always uses this form.
		action := ""
		if len(parts) == 2 {
			action = parts[1]
		}
		q := r.URL.Query()
		return a.one(ctx, w, r, q.Get("scope"), q.Get("id"), action)
	case parts[0] == "spool" && len(parts) == 1:
		if err := allow(w, r, http.MethodGet); err != nil {
			return err
		}
		return listSpools(w)
	case parts[0] == "spool" && len(parts) == 2:
		if err := allow(w, r, http.MethodPost); err != nil {
			return err
		}
		return a.spoolAction(w, r, parts[1]) // spool.go
	case parts[0] != "events":
		return apiErr(http.StatusNotFound, "unknown admin path; see /webhook_idempotency/events, /webhook_idempotency/scopes and /webhook_idempotency/spool")
	case len(parts) == 1 || (len(parts) == 2 && parts[1] == ""):
		if err := allow(w, r, http.MethodGet); err != nil {
			return err
		}
		return a.list(ctx, w, r)
	case len(parts) != 3 && len(parts) != 4:
		return apiErr(http.StatusNotFound, "want /webhook_idempotency/events/{scope}/{id}[/release|/complete]")
	}
	scope, err1 := url.PathUnescape(parts[1])
	id, err2 := url.PathUnescape(parts[2])
	if err1 != nil || err2 != nil {
		return apiErr(http.StatusBadRequest, "bad scope or event id in path")
	}
	action := ""
	if len(parts) == 4 {
		action = parts[3]
	}
	return a.one(ctx, w, r, scope, id, action)
}

// one serves one event: GET shows it, DELETE forgets it, POST with action
// release or complete resolves it.
func (a *Admin) one(ctx context.Context, w http.ResponseWriter, r *http.Request, scope, id, action string) error {
	if scope == "" || id == "" {
		return apiErr(http.StatusBadRequest, "bad scope or event id: both are required")
	}
	var to store.State
	if action != "" {
		switch action {
		case "release":
			to = store.StateReleased
		case "complete":
			to = store.StateCompleted
		default:
			return apiErr(http.StatusNotFound, "unknown action %q: want release or complete", action)
		}
		if err := allow(w, r, http.MethodPost); err != nil {
			return err
		}
	} else if err := allow(w, r, http.MethodGet, http.MethodDelete); err != nil {
		return err
	}
	bs := backendsFor(scope)
	if len(bs) == 0 {
		return apiErr(http.StatusNotFound, "no handler has scope %q", scope)
	}
	switch {
	case to != "":
		return a.resolve(ctx, w, bs, scope, id, to)
	case r.Method == http.MethodDelete:
		return a.forget(ctx, w, bs, scope, id)
	}
	e, err := getEvent(ctx, bs, scope, id)
	if err != nil {
		return err
	}
	return writeJSON(w, toJSON(e))
}

// allow answers 405, with an Allow header, unless the request's method is
// one of methods.
func allow(w http.ResponseWriter, r *http.Request, methods ...string) error {
	for _, m := range methods {
		if r.Method == m {
			return nil
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	return apiErr(http.StatusMethodNotAllowed, "method %s not allowed; want %s", r.Method, strings.Join(methods, " or "))
}

// getEvent returns the event from the first backend that has it.
func getEvent(ctx context.Context, bs []*backend, scope, id string) (store.Event, error) {
	for _, b := range bs {
		e, err := b.Get(ctx, scope, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return store.Event{}, storeErr(err)
		}
		return e, nil
	}
	return store.Event{}, apiErr(http.StatusNotFound, "event not found")
}

// storeErr is the answer to a store failure. The store's errors carry no
// DSN password or secret.
func storeErr(err error) error {
	return apiErr(http.StatusServiceUnavailable, "event store unavailable: %v", err)
}

func (a *Admin) forget(ctx context.Context, w http.ResponseWriter, bs []*backend, scope, id string) error {
	found := false
	for _, b := range bs {
		err := b.Forget(ctx, scope, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return storeErr(err)
		}
		forgetCached(scope, id)
		found = true
	}
	if !found {
		return apiErr(http.StatusNotFound, "event not found")
	}
	a.log("event forgotten by operator", scope, id)
	return writeJSON(w, map[string]any{"forgotten": true, "scope": scope, "event_id": id})
}

// resolve releases or completes a held or stuck event (store.Resolve) and
// answers with the event as it is now.
func (a *Admin) resolve(ctx context.Context, w http.ResponseWriter, bs []*backend, scope, id string, to store.State) error {
	var conflict error
	for _, b := range bs {
		err := b.Resolve(ctx, scope, id, to)
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue
		case errors.Is(err, store.ErrConflict):
			conflict = err
			continue
		case err != nil:
			return storeErr(err)
		}
		forgetCached(scope, id)
		e, err := b.Get(ctx, scope, id)
		if err != nil {
			return storeErr(err)
		}
		a.log("event "+string(to)+" by operator", scope, id)
		return writeJSON(w, toJSON(e))
	}
	if conflict != nil {
		return apiErr(http.StatusConflict, "%v; only a held event or a claim whose lease expired can be resolved (DELETE forgets any event)", conflict)
	}
	return apiErr(http.StatusNotFound, "event not found")
}

// log0 is the admin API's logger (Caddy's, before Provision).
func (a *Admin) log0() *zap.Logger {
	if a.logger != nil {
		return a.logger
	}
	return caddy.Log().Named("admin.api.webhook_idempotency")
}

func (a *Admin) log(msg, scope, id string) {
	if a.logger != nil {
		a.logger.Info(msg, zap.String("scope", scope), zap.String("event_id", id))
	}
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
	n, err := queryLimit(q)
	if err != nil {
		return err
	}
	lq.Limit = n
	if v := q.Get("older_than"); v != "" {
		d, err := caddy.ParseDuration(v)
		if err != nil || d < 0 {
			return apiErr(http.StatusBadRequest, "older_than: want a duration such as 5m")
		}
		lq.OlderThan = time.Now().Add(-d)
	}
	if v := q.Get("after_updated_at"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return apiErr(http.StatusBadRequest, "after_updated_at: want an RFC 3339 time, as in the previous page's next")
		}
		lq.AfterUpdatedAt = t
	}
	if err := store.CheckCursor(lq); err != nil {
		return apiErr(http.StatusBadRequest, "after_scope and after_id need after_updated_at: pass the previous page's next")
	}
	var all []store.Event
	for _, b := range backendsFor(lq.Scope) {
		es, err := b.List(ctx, lq)
		if err != nil {
			return storeErr(err)
		}
		all = append(all, es...)
	}
	// Several backends: merge their pages in List's order.
	slices.SortFunc(all, func(a, b store.Event) int {
		return cmp.Or(a.UpdatedAt.Compare(b.UpdatedAt), strings.Compare(a.Scope, b.Scope), strings.Compare(a.EventID, b.EventID))
	})
	if len(all) > lq.Limit {
		all = all[:lq.Limit]
	}
	events := make([]EventJSON, 0, len(all))
	for _, e := range all {
		events = append(events, toJSON(e))
	}
	out := map[string]any{"events": events}
	if len(all) == lq.Limit {
		last := all[len(all)-1]
		next := map[string]string{
			"after_updated_at": last.UpdatedAt.UTC().Format(time.RFC3339Nano),
			"after_scope":      last.Scope,
			"after_id":         last.EventID,
		}
		nq := r.URL.Query()
		for k, v := range next {
			nq.Set(k, v)
		}
		out["next"] = next
		out["next_url"] = adminPrefix + "events?" + nq.Encode()
	}
	return writeJSON(w, out)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*Admin)(nil)
	_ caddy.Provisioner = (*Admin)(nil)
)

// queryLimit reads the limit query parameter of a list: 1 to 1000,
// default 100.
func queryLimit(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		return 0, apiErr(http.StatusBadRequest, "limit: want 1..1000")
	}
	return n, nil
}
