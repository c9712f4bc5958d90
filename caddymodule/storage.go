package caddymodule

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cache"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/claim"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/dispatch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/sqlite"
)

// Storage selects the store backend.
type Storage struct {
	// Backend is "postgres" or "sqlite".
	Backend string `json:"backend,omitempty"`
	// DSN is the PostgreSQL connection string (postgres). {env.NAME}
	// placeholders are expanded; its password is never logged.
	DSN string `json:"dsn,omitempty"`
	// Path is the SQLite database file (sqlite).
	Path string `json:"path,omitempty"`
	// Table is the name of the events table, so the gateway can share a
	// database with the application. Default: webhook_events.
	Table string `json:"table,omitempty"`

	// emptyHint, set by Handler.storage, says why the DSN or path expanded
	// to nothing ({env.NAME} unset, {file.path} empty).
	emptyHint string
}

// backendKind is one kind of store the storage field names: a backend is
// added by adding a row to backendKinds.
type backendKind struct {
	// name is storage's backend, the Caddyfile's storage <name> <arg>.
	name string
	// where is the field that locates the database (DSN or Path), the one
	// the Caddyfile's argument fills; whereName names it in errors.
	where     func(*Storage) *string
	whereName string
	// redact names the database for an error message, never a password.
	redact func(Storage) string
	// queue: the backend can hold async mode's queue (shared by every
	// instance).
	queue bool
	// open opens the store and runs its migrations.
	open func(ctx context.Context, c Storage) (opened, error)
	// waits reports whether an error of open says only that the database
	// could not be reached now (refused, timed out, starting up): the
	// gateway then starts and opens the store in the background
	// (storeready.go). Any other error fails the config's load. nil: every
	// error fails it.
	waits func(err error) bool
}

// opened is a store a backendKind opened; newQueue (nil unless the kind
// has a queue) creates async mode's queue on its pool.
type opened struct {
	store    store.Store
	newQueue func(ctx context.Context) (closingQueue, error)
}

// closingQueue is a queue with a batch writer to stop.
type closingQueue interface {
	queue.Queue
	Close()
}

var backendKinds = []backendKind{
	{
		name:      "postgres",
		where:     func(c *Storage) *string { return &c.DSN },
		whereName: "DSN",
		redact: func(c Storage) string {
			if u, err := url.Parse(c.DSN); err == nil && u.Scheme != "" && !strings.ContainsAny(c.DSN, " ") {
				return u.Redacted()
			}
			return "a key=value DSN"
		},
		queue: true,
		open: func(ctx context.Context, c Storage) (opened, error) {
			s, err := postgres.New(ctx, postgres.Options{DSN: c.DSN, Table: c.Table,
				Batch: store.BatchOptions{Observe: observeBatch}, Retried: observeRetry})
			if err != nil {
				return opened{}, err
			}
			return opened{store: s, newQueue: func(ctx context.Context) (closingQueue, error) {
				q, err := pgqueue.New(ctx, s, pgqueue.Options{Batch: pgqueue.BatchOptions{Observe: observeBatch}})
				if err != nil {
					return nil, err
				}
				return q, nil
			}}, nil
		},
		waits: func(err error) bool { return errors.Is(err, postgres.ErrUnreachable) },
	},
	{
		name:      "sqlite",
		where:     func(c *Storage) *string { return &c.Path },
		whereName: "path",
		redact:    func(c Storage) string { return c.Path },
		open: func(ctx context.Context, c Storage) (opened, error) {
			s, err := sqlite.New(ctx, sqlite.Options{Path: c.Path, Table: c.Table,
				Batch: store.BatchOptions{Observe: observeBatch}})
			return opened{store: s}, err
		},
	},
}

// kindOf returns the backend named name, nil when there is none.
func kindOf(name string) *backendKind {
	i := slices.IndexFunc(backendKinds, func(k backendKind) bool { return k.name == name })
	if i < 0 {
		return nil
	}
	return &backendKinds[i]
}

// checkStorage checks the storage field (part of checkCommon).
func (h *Handler) checkStorage() error {
	if h.Storage == nil || h.Storage.Backend == "" || kindOf(h.Storage.Backend) != nil {
		return nil
	}
	var names []string
	for _, k := range backendKinds {
		names = append(names, k.name)
	}
	return fmt.Errorf("storage: unknown backend %q (want %s)", h.Storage.Backend, strings.Join(names, " or "))
}

// hasQueue reports whether the configured storage can hold async mode's
// queue.
func (h *Handler) hasQueue() bool {
	return h.Storage != nil && kindOf(h.Storage.Backend) != nil && kindOf(h.Storage.Backend).queue
}

// setStorage sets the storage field from the Caddyfile's storage <kind>
// <arg> (checkStorage refuses an unknown kind).
func (h *Handler) setStorage(kind, arg string) {
	if h.Storage == nil {
		h.Storage = new(Storage)
	}
	h.Storage.Backend = kind
	if k := kindOf(kind); k != nil {
		*k.where(h.Storage) = arg
	} else {
		h.Storage.Path = arg
	}
}

// storage returns where the handler's events are kept, placeholders
// expanded: the configured backend, or the default SQLite file in Caddy's
// data directory (whose table `table` alone may name).
func (h *Handler) storage() Storage {
	repl := caddy.NewReplacer()
	st := Storage{Backend: "sqlite", Path: filepath.Join(caddy.AppDataDir(), "webhook_idempotency", "events.db")}
	if h.Storage != nil {
		table := h.Storage.Table
		if h.Storage.Backend != "" {
			st = *h.Storage
			st.DSN = repl.ReplaceAll(st.DSN, "")
			st.Path = repl.ReplaceAll(st.Path, "")
			if raw := h.Storage.location(); raw != "" && st.location() == "" {
				st.emptyHint = cmp.Or(emptyHint(raw), " ("+raw+" expands to nothing)")
			}
		}
		st.Table = table
	}
	return st
}

// location is the storage's DSN or path.
func (c Storage) location() string {
	if k := kindOf(c.Backend); k != nil {
		return *k.where(&c)
	}
	return c.Path
}

func (c Storage) poolKey() string {
	return c.Backend + "\x00" + c.location() + "\x00" + c.Table
}

// describe names the storage for an error message: the backend, the SQLite
// path or the PostgreSQL DSN with its password redacted, and the table.
func (c Storage) describe() string {
	table := c.Table
	if table == "" {
		table = "webhook_events"
	}
	where := c.Path
	if k := kindOf(c.Backend); k != nil {
		where = k.redact(c)
	}
	return fmt.Sprintf("%s %s (table %s)", c.Backend, where, table)
}

// backends holds one store per backend, DSN or path, and table, for the
// whole process: every handler that names the same database shares one
// pgxpool, and the pool survives config reloads (a reload provisions the
// new handlers before it cleans up the old ones).
var backends = caddy.NewUsagePool()

// cacheTTL bounds how long a completed ID is answered from an instance's
// memory without asking the store; it is the longest an event forgotten by
// an operator can still be answered as a duplicate by another instance.
const cacheTTL = time.Minute

// backend is the pooled value: a store (its caches of completed IDs are
// caches').
type backend struct {
	store.Store
	// secrets keeps the secrets learned in handshakes (handshake.go); nil
	// when the store has none.
	secrets store.Secrets
	// completing registers the completions being written after their
	// answers (internal/claim) by every handler of this store: a duplicate
	// through another route of the scope, or reaching the handler of a
	// reloaded config, waits for them as one through the same handler does.
	completing *claim.Completions
	// newQueue creates async mode's queue on the store; nil: none.
	newQueue func(ctx context.Context) (closingQueue, error)
	// pending is the store while it is opened in the background (its
	// database was unreachable at start); nil when it opened at once.
	pending *pendingStore
}

// Destruct implements caddy.Destructor: the last handler using the store is
// gone.
func (b *backend) Destruct() error { return b.Close() }

// openTimeout bounds one opening of a store: connecting and migrating.
const openTimeout = 30 * time.Second

// openBackend returns the pooled backend for the storage config, opening the
// store (and running its migrations) on first use. A database the kind
// says is only unreachable (backendKind.waits) does not fail: the backend
// is returned with a pendingStore, opened in the background, whose calls
// fail until then.
func openBackend(c Storage, logger *zap.Logger) (*backend, error) {
	k := kindOf(c.Backend)
	switch {
	case k == nil:
		return nil, fmt.Errorf("unknown storage backend %q", c.Backend)
	case c.emptyHint != "":
		return nil, fmt.Errorf("the %s is empty%s", k.whereName, c.emptyHint)
	}
	return loadPooled[*backend](backends, c.poolKey(), func() (caddy.Destructor, error) {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		defer cancel()
		o, err := k.open(ctx, c)
		switch {
		case err != nil && k.waits != nil && k.waits(err):
			p := openLater(c, k, err, logger)
			b := &backend{Store: p, completing: claim.NewCompletions(), pending: p}
			b.secrets = p
			b.newQueue = func(context.Context) (closingQueue, error) { return newPendingQueue(p), nil }
			return b, nil
		case err != nil:
			return nil, err
		}
		b := &backend{Store: o.store, completing: claim.NewCompletions(), newQueue: o.newQueue}
		b.secrets, _ = o.store.(store.Secrets)
		return b, nil
	})
}

// queues holds the queue of async mode and its dispatcher, one per storage
// (DSN and table) per process, next to the store's backends: every async
// handler of that storage registers its route (scope) with the dispatcher,
// config reloads hand a route over to the new config without stopping it,
// and when the last handler is cleaned up the dispatcher stops gracefully.
// Every instance runs one; they share the work through the database.
var queues = caddy.NewUsagePool()

// queueBackend is the pooled value: the queue of one storage and its
// dispatcher.
type queueBackend struct {
	q     queue.Queue
	d     *dispatch.Dispatcher
	close func() // stops the queue's batch writer
}

// Destruct implements caddy.Destructor: the last handler using the queue is
// gone. Deliveries in flight get the dispatcher's grace period to finish.
func (qb *queueBackend) Destruct() error {
	qb.d.Stop()
	qb.close()
	return nil
}

// openQueue returns the pooled queue of a store backend, creating its
// tables (named after the store's table) on first use. key is the store
// backend's pool key: the queue uses the store's connection pool, and a
// handler releases the queue before the store, so the pool outlives the
// dispatcher.
func openQueue(key string, b *backend) (*queueBackend, error) {
	return loadPooled[*queueBackend](queues, key, func() (caddy.Destructor, error) {
		if b.newQueue == nil {
			return nil, errors.New("the store keeps no queue")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		q, err := b.newQueue(ctx)
		if err != nil {
			return nil, err
		}
		d := dispatch.New(q, dispatch.Options{
			Logger: caddy.Log().Named("http.handlers.webhook_idempotency.dispatcher"),
			Metrics: dispatch.Metrics{Depth: queueMetrics.depth, Oldest: queueMetrics.oldest,
				Attempts: queueMetrics.attempts, Dead: queueMetrics.dead, Store: metrics.store},
			SweepInterval: retentionInterval,
			SweepBatch:    retentionBatch,
			StoreTimeout:  storeTimeout,
		})
		return &queueBackend{q: q, d: d, close: q.Close}, nil
	})
}

// loadPooled returns pool's value for key, made by construct on first
// use.
func loadPooled[T caddy.Destructor](pool *caddy.UsagePool, key string, construct caddy.Constructor) (T, error) {
	var zero T
	val, _, err := pool.LoadOrNew(key, construct)
	if err != nil {
		return zero, err
	}
	v, ok := val.(T)
	if !ok {
		return zero, errors.New("the storage pool holds an unexpected value")
	}
	return v, nil
}

// caches holds the caches of completed IDs, one per storage and size its
// routes ask for (cache), each shared by the routes that ask for that size
// and kept while one of them is loaded: across reloads, and past a reload
// that changes the size until the old routes are cleaned up. One cache per
// storage, sized by the route that opened it first, made every other
// route's cache, and any reload's, silently ineffective.
var caches = caddy.NewUsagePool()

// pooledCache is caches' value.
type pooledCache struct{ *cache.Completed }

// Destruct implements caddy.Destructor: the last route using the cache is
// gone (a settle still running adds nothing to a closed cache).
func (c pooledCache) Destruct() error {
	c.Close()
	return nil
}

// takeCache returns the route's cache of completed IDs on its storage
// (poolKey), made on first use; the route's Cleanup gives it back
// (caches.Delete of cacheKey).
func (h *Handler) takeCache() (*cache.Completed, error) {
	c, err := loadPooled[pooledCache](caches, h.cacheKey(), func() (caddy.Destructor, error) {
		c, err := cache.New(h.cacheEntries(), cacheTTL)
		return pooledCache{c}, err
	})
	return c.Completed, err
}

// cacheKey is the route's key in caches.
func (h *Handler) cacheKey() string { return h.poolKey + "\x00cache " + strconv.Itoa(h.cacheEntries()) }

// forgetCached drops an event an operator forgot or resolved from every
// cache (a scope's events live on one storage).
func forgetCached(scope, id string) {
	caches.Range(func(_, v any) bool {
		if c, ok := v.(pooledCache); ok {
			c.Forget(scope, id)
		}
		return true
	})
}

// cacheEntries is the size of the route's cache of completed IDs (cache):
// 0 for none.
func (h *Handler) cacheEntries() int {
	if h.Cache == nil {
		return defaultCache
	}
	return *h.Cache
}
