package caddymodule

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/fileserver"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// A claimed forward must reach the upstream at most once. reverse_proxy
// re-sends a request it has already written when its load balancing has
// retries (lb_retries or lb_try_duration) and the request matches
// lb_retry_match (a request matcher; a response matcher such as
// `expression {rp.status_code} in [502, 503]` re-sends after the upstream
// answered). Without lb_retry_match it re-sends only a GET, or a request
// it could not connect for (nothing was written): both are safe here. An
// upstream that did the work and then failed would run twice inside one
// forward, so such a reverse_proxy after this handler is refused.

// checkRoutes refuses a config whose routes defeat the handler: one in
// which a reverse_proxy that re-sends written requests may run after a
// webhook_idempotency handler (later in the same route, in a later route
// of the same list not in the same exclusive group, or in a subroute of
// one), and one in which a webhook_idempotency handler never runs. It reads
// the routes as raw JSON where they are not provisioned yet (those after
// the handler being provisioned) and as modules where they are. A nil or
// non-http app (handler unit tests) checks nothing.
//
// The answer is the config's, whichever of its handlers asks, so it is
// worked out once per config (routeChecks): a config of a hundred routes
// would otherwise read every route's JSON once per handler.
func checkRoutes(app any) error {
	a, ok := app.(*caddyhttp.App)
	if !ok {
		return nil
	}
	if err, done := routeChecks.Load(app); done {
		err, _ := err.(error)
		return err
	}
	err := checkServers(a)
	routeChecks.Store(app, err)
	return err
}

// routeChecks holds checkRoutes' answer per config's http app, until the
// config is unloaded (forgetHostWarnings).
var routeChecks sync.Map

func checkServers(a *caddyhttp.App) error {
	for name, srv := range a.Servers {
		if srv == nil {
			continue
		}
		routes := routeNodes(srv.Routes)
		if _, bad := unsafeRetriesAfter(routes, false); bad != "" {
			return fmt.Errorf("server %s: a reverse_proxy after webhook_idempotency re-sends requests it has already written "+
				"(%s): an upstream that did the work and then failed would run twice inside one forward; remove lb_retry_match "+
				"(reverse_proxy then retries a POST only when it could not connect, which is safe) or set lb_retries 0", name, bad)
		}
		if before := unreachable(routes, "", sharedGroups(routes)); before != "" {
			return fmt.Errorf("server %s: webhook_idempotency never runs: %s answers every request first, so deliveries would be "+
				"forwarded unverified and every redelivery run again; put webhook_idempotency before it (a route block keeps the "+
				"order it is written in; elsewhere the directive is ordered before handle, route, respond and reverse_proxy)", name, before)
		}
	}
	return nil
}

// rnode and hnode are a route tree read from either form.
type rnode struct {
	group    string
	matched  bool // the route has matchers: it may not run
	terminal bool // the route ends the chain when it runs
	handlers []hnode
}

type hnode struct {
	ours    bool    // a webhook_idempotency handler
	unsafe  string  // a reverse_proxy that re-sends written requests: what it has
	routes  []rnode // a subroute's routes
	answers string  // a handler that answers every request it gets (never calls the next): its name
}

// answering are the handlers that answer every request they get, by
// module name, but for what hnode's readers tell apart: file_server with
// pass_thru, reverse_proxy with handle_response routes (forward_auth
// passes a request its auth service accepted on), respond with a 1xx
// status (103 Early Hints). acme_server passes on what is not under its
// path prefix, so it is not among them.
var answering = map[string]bool{"reverse_proxy": true, "static_response": true, "file_server": true, "error": true}

// unreachable walks routes in their order, blocked by what answers every
// request before them (blocker), and describes what answers first for a
// webhook_idempotency handler that never runs, or returns "". Only what is
// sure to answer counts (answersAll): a route with matchers may not run, a
// grouped route may be skipped, and a subroute may pass requests on.
// shared are the groups found in more than one route list (sharedGroups).
func unreachable(routes []rnode, blocker string, shared map[string]bool) string {
	leaky := map[string]bool{}
	for _, r := range routes {
		local := blocker
		for _, h := range r.handlers {
			switch {
			case h.ours && local != "":
				return local
			case h.routes != nil:
				if b := unreachable(h.routes, local, shared); b != "" {
					return b
				}
				if a := answersAll(h.routes, shared); a != "" && local == "" {
					local = a + " (before it in the same route)"
				}
			case h.answers != "" && local == "":
				local = h.answers + " (before it in the same route)"
			}
		}
		a, blocks := answersEverything(r, leaky, shared)
		if blocker != "" || !blocks {
			continue
		}
		if a != "" {
			blocker = a + " (in an earlier route with no matcher)"
		} else if r.terminal && r.group == "" {
			blocker = "an earlier terminal route with no matcher"
		}
	}
	return ""
}

// answersAll names a handler that answers every request routes get, or
// returns "" (answersEverything).
func answersAll(routes []rnode, shared map[string]bool) string {
	leaky := map[string]bool{}
	for _, r := range routes {
		if a, blocks := answersEverything(r, leaky, shared); blocks && a != "" {
			return a
		}
	}
	return ""
}

// answersEverything reports whether r, taken in its list's order, gets
// every request that reaches it (no matcher, and its group, if any, is
// not shared with another list and no earlier route of it passes a
// request on: leaky, which it updates), and names what in it answers them
// all ("" when nothing does): a handler, or a subroute that answers all (a
// catch-all handle block).
func answersEverything(r rnode, leaky, shared map[string]bool) (string, bool) {
	a := ""
	for _, h := range r.handlers {
		if h.answers != "" {
			a = h.answers
			break
		}
		if h.routes != nil {
			if a = answersAll(h.routes, shared); a != "" {
				break
			}
		}
	}
	g := r.group
	takesAll := !r.matched && (g == "" || (!shared[g] && !leaky[g]))
	if g != "" && a == "" {
		leaky[g] = true // requests it matches go on past the whole group
	}
	return a, takesAll
}

// sharedGroups are the route groups found in more than one route list:
// Caddy keeps one record of the groups a request has matched, across
// subroutes, so such a group's routes may be skipped in ways one list does
// not show.
func sharedGroups(routes []rnode) map[string]bool {
	lists := map[string]int{}
	var walk func([]rnode)
	walk = func(routes []rnode) {
		here := map[string]bool{}
		for _, r := range routes {
			if r.group != "" && !here[r.group] {
				here[r.group] = true
				lists[r.group]++
			}
			for _, h := range r.handlers {
				if h.routes != nil {
					walk(h.routes)
				}
			}
		}
	}
	walk(routes)
	shared := map[string]bool{}
	for g, n := range lists {
		if n > 1 {
			shared[g] = true
		}
	}
	return shared
}

// unsafeRetriesAfter walks routes in their order; armed says a
// webhook_idempotency handler may already have run. It reports whether one
// is in routes, and the first unsafe reverse_proxy that may run after one.
func unsafeRetriesAfter(routes []rnode, armed bool) (ours bool, unsafe string) {
	var ungrouped bool
	groups := map[string]bool{}
	for _, r := range routes {
		local := armed || ungrouped
		for g, seen := range groups {
			if seen && (r.group == "" || g != r.group) {
				local = true
			}
		}
		here := false
		for _, h := range r.handlers {
			switch {
			case h.ours:
				local, here = true, true
			case h.unsafe != "" && local:
				return true, h.unsafe
			case h.routes != nil:
				sub, bad := unsafeRetriesAfter(h.routes, local)
				if bad != "" {
					return true, bad
				}
				if sub {
					local, here = true, true
				}
			}
		}
		if here {
			ours = true
			if r.group == "" {
				ungrouped = true
			} else {
				groups[r.group] = true
			}
		}
	}
	return ours, ""
}

// routeNodes reads provisioned or raw routes.
func routeNodes(routes caddyhttp.RouteList) []rnode {
	out := make([]rnode, 0, len(routes))
	for _, r := range routes {
		n := rnode{group: r.Group, matched: len(r.MatcherSetsRaw) > 0 || len(r.MatcherSets) > 0, terminal: r.Terminal}
		if r.HandlersRaw != nil {
			for _, raw := range r.HandlersRaw {
				n.handlers = append(n.handlers, rawHandlerNode(raw))
			}
		} else {
			for _, h := range r.Handlers {
				n.handlers = append(n.handlers, handlerNode(h))
			}
		}
		out = append(out, n)
	}
	return out
}

func handlerNode(h caddyhttp.MiddlewareHandler) hnode {
	switch h := h.(type) {
	case *Handler:
		return hnode{ours: true}
	case *caddyhttp.Subroute:
		return hnode{routes: routeNodes(h.Routes)}
	case *reverseproxy.Handler:
		n := hnode{}
		if len(h.HandleResponse) == 0 {
			n.answers = "reverse_proxy"
		}
		if lb := h.LoadBalancing; lb != nil {
			n.unsafe = retryWhat(lb.Retries, int64(lb.TryDuration), len(lb.RetryMatchRaw) > 0 || len(lb.RetryMatch) > 0)
		}
		return n
	case *fileserver.FileServer:
		if !h.PassThru {
			return hnode{answers: "file_server"}
		}
		return hnode{}
	case *caddyhttp.StaticResponse:
		if informational(string(h.StatusCode)) {
			return hnode{}
		}
	}
	if m, ok := h.(caddy.Module); ok {
		if name := string(m.CaddyModule().ID.Name()); answering[name] && name != "file_server" {
			return hnode{answers: name}
		}
	}
	return hnode{}
}

// rawHandler is what the check reads of a handler's JSON.
type rawHandler struct {
	Handler        string            `json:"handler"`
	PassThru       bool              `json:"pass_thru"`
	HandleResponse []json.RawMessage `json:"handle_response"`
	StatusCode     json.RawMessage   `json:"status_code"`
	Routes         []struct {
		Group    string            `json:"group"`
		Match    json.RawMessage   `json:"match"`
		Terminal bool              `json:"terminal"`
		Handle   []json.RawMessage `json:"handle"`
	} `json:"routes"`
	LoadBalancing *struct {
		Retries     int             `json:"retries"`
		TryDuration json.RawMessage `json:"try_duration"`
		RetryMatch  json.RawMessage `json:"retry_match"`
	} `json:"load_balancing"`
}

func rawHandlerNode(raw json.RawMessage) hnode {
	var h rawHandler
	if json.Unmarshal(raw, &h) != nil {
		return hnode{}
	}
	switch h.Handler {
	case "webhook_idempotency":
		return hnode{ours: true}
	case "subroute":
		n := hnode{routes: []rnode{}}
		for _, r := range h.Routes {
			rn := rnode{group: r.Group, matched: hasMatcher(r.Match), terminal: r.Terminal}
			for _, raw := range r.Handle {
				rn.handlers = append(rn.handlers, rawHandlerNode(raw))
			}
			n.routes = append(n.routes, rn)
		}
		return n
	case "reverse_proxy":
		n := hnode{}
		if len(h.HandleResponse) == 0 {
			n.answers = "reverse_proxy"
		}
		if lb := h.LoadBalancing; lb != nil {
			try := int64(0)
			if d := string(lb.TryDuration); d != "" && d != "0" && d != `""` && d != "null" {
				try = 1
			}
			match := len(lb.RetryMatch) > 0 && string(lb.RetryMatch) != "null" && string(lb.RetryMatch) != "[]"
			n.unsafe = retryWhat(lb.Retries, try, match)
		}
		return n
	case "file_server":
		if h.PassThru {
			return hnode{}
		}
	case "static_response":
		if informational(strings.Trim(string(h.StatusCode), `"`)) {
			return hnode{}
		}
	}
	if answering[h.Handler] {
		return hnode{answers: h.Handler}
	}
	return hnode{}
}

// retryWhat describes an unsafe retry configuration, or "" when it re-sends
// nothing written.
func retryWhat(retries int, tryDuration int64, match bool) string {
	switch {
	case !match:
		return ""
	case retries > 0:
		return fmt.Sprintf("lb_retries %d with lb_retry_match", retries)
	case tryDuration > 0:
		return "lb_try_duration with lb_retry_match"
	}
	return ""
}

// informational reports whether a respond's status is 1xx (103 Early
// Hints), after which Caddy runs the next handler.
func informational(status string) bool {
	n, err := strconv.Atoi(status)
	return err == nil && n >= 100 && n < 200
}

// hasMatcher reports whether a route's raw "match" holds a matcher: a set
// with at least one (an empty set, [{}], matches every request).
func hasMatcher(raw json.RawMessage) bool {
	var sets []map[string]json.RawMessage
	if json.Unmarshal(raw, &sets) != nil {
		return len(raw) > 0 && string(raw) != "null" // unreadable: assume it may not match
	}
	for _, set := range sets {
		if len(set) > 0 {
			return true
		}
	}
	return false
}
