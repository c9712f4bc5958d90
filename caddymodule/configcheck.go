package caddymodule

import (
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
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
	key  string // Storage.poolKey: backend, DSN or path, table
	desc string // for the error: never a DSN password
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

// useScopeStorage records that a route of the config app uses scope on st,
// and refuses a scope already used on another storage: two routes that
// share a scope promise to share deduplication, which two stores cannot
// keep. A nil app (no config) checks nothing.
func useScopeStorage(app any, scope string, st Storage) error {
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
		u.n++
		return nil
	}
	uses[scope] = &scopeUse{key: key, desc: st.describe(), n: 1}
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

// describe names the storage for an error message: the backend, the SQLite
// path or the PostgreSQL DSN with its password redacted, and the table.
func (c Storage) describe() string {
	table := c.Table
	if table == "" {
		table = "webhook_events"
	}
	where := c.Path
	if c.Backend == "postgres" {
		where = "a key=value DSN"
		if u, err := url.Parse(c.DSN); err == nil && u.Scheme != "" && !strings.ContainsAny(c.DSN, " ") {
			where = u.Redacted()
		}
	}
	return fmt.Sprintf("%s %s (table %s)", c.Backend, where, table)
}
