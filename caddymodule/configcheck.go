package caddymodule

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// Checks across the routes of one loaded config. A handler sees only its own
// JSON, so what two routes must agree on is recorded per config, keyed by the
// config's http app (the same value for every handler a load provisions;
// another load, a reload's new config, has another one).

// configScopes maps each config's http app to the storage of every scope its
// handlers use.
var configScopes = struct {
	sync.Mutex
	m map[any]map[string]*scopeUse
}{m: map[any]map[string]*scopeUse{}}

type scopeUse struct {
	key   string // Storage.poolKey: backend, DSN or path, table
	desc  string // for the error: never a DSN password
	trust string // Handler.trust of the routes using it (trust.go)
	// budget is their body_budget: they share one (budget.go).
	budget int64
	// keep is how long they keep the scope's rows (Handler.keepText):
	// every route's sweep deletes them after its own.
	keep string
	n    int
}

// httpApp returns the http app of the config ctx belongs to, or nil when
// ctx carries no config (handler unit tests provision on a bare context).
func httpApp(ctx caddy.Context) any {
	app, err := ctx.AppIfConfigured("http")
	if err != nil {
		return nil
	}
	return app
}

// useScopeStorage records that a route of the config app uses scope on st
// with the given trust and body_budget, and refuses a scope already used
// on another storage (two routes that share a scope promise to share
// deduplication, which two stores cannot keep), by a route of another
// trust (one route's requests could pre-claim the other's events:
// trust.go) or with another body_budget (the scope's routes share one
// budget: budget.go). A nil app (no config) checks nothing.
func useScopeStorage(app any, scope string, st Storage, trust string, budget int64, keep string) error {
	if app == nil {
		return nil
	}
	configScopes.Lock()
	defer configScopes.Unlock()
	uses := configScopes.m[app]
	if uses == nil {
		uses = map[string]*scopeUse{}
		configScopes.m[app] = uses
	}
	key := st.poolKey()
	if u := uses[scope]; u != nil {
		if u.key != key {
			return fmt.Errorf("scope: %q is already used by another route on %s, and this route stores it on %s; "+
				"routes sharing a scope share deduplication only on one storage (same backend, DSN or path, and table): "+
				"give them the same storage, or distinct scopes", scope, u.desc, st.describe())
		}
		if u.trust != trust {
			return fmt.Errorf("scope: %q is already used by a route that verifies with %s, and this route verifies with %s; "+
				"a claim made through one route would make the other answer that event as a duplicate, never forwarded, "+
				"so routes share a scope only when they verify the same way (provider, secrets, event_id, on_missing_id): "+
				"give each route its own scope (scope <name>)", scope, u.trust, trust)
		}
		if u.budget != budget {
			return fmt.Errorf("body_budget: routes of scope %q give it %s and %s; they share one budget (a default counts as given): write the same body_budget in each",
				scope, sizeText(u.budget), sizeText(budget))
		}
		if u.keep != keep {
			return fmt.Errorf("scope: routes of scope %q keep its rows for %s and for %s; each route's sweep deletes them after its own, "+
				"so the shortest would apply to all (an event forwarded again while its provider still retries or its timestamp is accepted): "+
				"write the same retention, replay_window and tolerance in each, or give each route its own scope", scope, u.keep, keep)
		}
		u.n++
		return nil
	}
	uses[scope] = &scopeUse{key: key, desc: st.describe(), trust: trust, budget: budget, keep: keep, n: 1}
	return nil
}

// releaseScopeStorage undoes one useScopeStorage, when a handler is cleaned
// up.
func releaseScopeStorage(app any, scope string) {
	if app == nil {
		return
	}
	configScopes.Lock()
	defer configScopes.Unlock()
	uses := configScopes.m[app]
	if u := uses[scope]; u != nil {
		if u.n--; u.n == 0 {
			delete(uses, scope)
		}
	}
	if len(uses) == 0 {
		delete(configScopes.m, app)
	}
}

// hostWarned records, per config, the servers already warned about by
// warnHostOnly, so a server with several webhook routes warns once.
var hostWarned = struct {
	sync.Mutex
	m map[any]map[string]bool
}{m: map[any]map[string]bool{}}

// handlerPattern finds this module in a route's JSON not yet provisioned.
var handlerPattern = regexp.MustCompile(`"handler"\s*:\s*"webhook_idempotency"`)

// warnHostOnly warns, once per server of the config, when a server that runs
// a webhook_idempotency route has only routes under host matchers (a site
// address such as hooks.example.com or http://127.0.0.1:8080). Caddy answers
// a request for any other Host on that listener with an empty 200: a
// provider's delivery sent with another Host (a proxy in between, a changed
// DNS name, an IP) is acknowledged and never reaches the route, so the event
// is lost. It looks at the top-level routes only; their matchers are
// provisioned before any handler (caddyhttp's autohttps), so they are
// complete when a handler is provisioned.
func warnHostOnly(app any, logger *zap.Logger) {
	a, ok := app.(*caddyhttp.App)
	if !ok || logger == nil {
		return
	}
	for name, srv := range a.Servers {
		if srv == nil || !routesHaveHandler(srv.Routes) {
			continue
		}
		hosts, only := hostOnly(srv.Routes)
		if !only {
			continue
		}
		hostWarned.Lock()
		if hostWarned.m[app] == nil {
			hostWarned.m[app] = map[string]bool{}
		}
		done := hostWarned.m[app][name]
		hostWarned.m[app][name] = true
		hostWarned.Unlock()
		if done {
			continue
		}
		logger.Warn("server answers requests for other hosts with an empty 200: a delivery sent with another Host is acknowledged "+
			"and lost; use a site address without a host (:8080) or add a catch-all site that answers 404",
			zap.String("server", name), zap.Strings("listen", srv.Listen), zap.Strings("hosts", hosts))
	}
}

// forgetHostWarnings drops a config's records (its host warnings and
// checkRoutes' answer) when it is unloaded.
func forgetHostWarnings(app any) {
	routeChecks.Delete(app)
	hostWarned.Lock()
	delete(hostWarned.m, app)
	hostWarned.Unlock()
}

// routesHaveHandler reports whether a webhook_idempotency handler is among
// the routes, provisioned or still raw JSON.
func routesHaveHandler(routes caddyhttp.RouteList) bool {
	for _, r := range routes {
		if handlerPattern.Match(mustJSON(r.HandlersRaw)) {
			return true
		}
		for _, h := range r.Handlers {
			switch h := h.(type) {
			case *Handler:
				return true
			case *caddyhttp.Subroute:
				if routesHaveHandler(h.Routes) {
					return true
				}
			}
		}
	}
	return false
}

func mustJSON(raws []json.RawMessage) []byte {
	var b []byte
	for _, r := range raws {
		b = append(b, r...)
	}
	return b
}

// hostOnly reports whether every route matches only under a host matcher,
// and the hosts named.
func hostOnly(routes caddyhttp.RouteList) ([]string, bool) {
	var hosts []string
	for _, r := range routes {
		if len(r.MatcherSets) == 0 {
			return nil, false
		}
		for _, set := range r.MatcherSets {
			found := false
			for _, m := range set {
				switch m := m.(type) {
				case caddyhttp.MatchHost:
					found, hosts = true, append(hosts, m...)
				case *caddyhttp.MatchHost:
					found, hosts = true, append(hosts, *m...)
				}
			}
			if !found {
				return nil, false
			}
		}
	}
	slices.Sort(hosts)
	return slices.Compact(hosts), len(routes) > 0
}

// validateOnly reports whether this process only validates the config
// (caddy validate, caddy adapt --validate): it provisions the config and
// cleans it up without ever serving it, next to the gateway that runs the
// config in use. So it checks a spool directory but does not open it (the
// gateway holds its lock and writes it), registers no async route (which
// would deliver the queue at once, perhaps to another deliver_to), and
// records no route load (which opens an enrollment window).
func validateOnly() bool {
	if len(os.Args) < 2 {
		return false
	}
	switch os.Args[1] {
	case "validate":
		return true
	case "adapt":
		return slices.ContainsFunc(os.Args[2:], func(a string) bool {
			a = strings.TrimLeft(a, "-")
			return a == "validate" || a == "validate=true"
		})
	}
	return false
}
