package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cache"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/dispatch"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue"
	pgqueue "github.com/webhook-idempotency/caddy-webhook-idempotency/internal/queue/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/postgres"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/sqlite"
)

// backends holds one store (and its cache of completed IDs) per backend, DSN
// or path, and table, for the whole process: every handler that names the
// same database shares one pgxpool, and the pool survives config reloads
// (a reload provisions the new handlers before it cleans up the old ones).
var backends = caddy.NewUsagePool()

// cacheTTL bounds how long a completed ID is answered from an instance's
// memory without asking the store; it is the longest an event forgotten by
// an operator can still be answered as a duplicate by another instance.
const cacheTTL = time.Minute

// backend is the pooled value: a store and the cache of its completed IDs.
type backend struct {
	store.Store
	completed *cache.Completed
	// secrets keeps the secrets learned in handshakes (handshake.go); nil
	// when the store has none.
	secrets store.Secrets
	// completing registers the completions being written after their
	// answers (settle.go) by every handler of this store, eventKey → chan
	// struct{}: a duplicate through another route of the scope, or reaching
	// the handler of a reloaded config, waits for them as one through the
	// same handler does.
	completing *sync.Map
}

// Destruct implements caddy.Destructor: the last handler using the store is
// gone.
func (b *backend) Destruct() error {
	b.completed.Close()
	return b.Close()
}

func (c Storage) poolKey() string {
	switch c.Backend {
	case "postgres":
		return "postgres\x00" + c.DSN + "\x00" + c.Table
	default:
		return "sqlite\x00" + c.Path + "\x00" + c.Table
	}
}

// openBackend returns the pooled backend for the storage config, opening the
// store (and running its migrations) on first use.
func openBackend(c Storage, cacheEntries int) (*backend, bool, error) {
	val, loaded, err := backends.LoadOrNew(c.poolKey(), func() (caddy.Destructor, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var (
			s   store.Store
			err error
		)
		switch c.Backend {
		case "postgres":
			s, err = postgres.New(ctx, postgres.Options{DSN: c.DSN, Table: c.Table,
				Batch: store.BatchOptions{Observe: observeBatch}, Retried: observeRetry})
		case "sqlite":
			s, err = sqlite.New(ctx, sqlite.Options{Path: c.Path, Table: c.Table,
				Batch: store.BatchOptions{Observe: observeBatch}})
		default:
			err = fmt.Errorf("unknown storage backend %q", c.Backend)
		}
		if err != nil {
			return nil, err
		}
		entries := cacheEntries
		if entries <= 0 {
			entries = defaultCache
		}
		comp, err := cache.New(entries, cacheTTL)
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		b := &backend{Store: s, completed: comp, completing: new(sync.Map)}
		b.secrets, _ = s.(store.Secrets)
		return b, nil
	})
	if err != nil {
		return nil, false, err
	}
	b, ok := val.(*backend)
	if !ok {
		return nil, false, errors.New("storage pool holds an unexpected value")
	}
	return b, loaded, nil
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
// tables (named after the store's table) on first use. key is the store backend's pool key: the queue uses
// the store's connection pool, and a handler releases the queue before the
// store, so the pool outlives the dispatcher.
func openQueue(key string, b *backend) (*queueBackend, error) {
	val, _, err := queues.LoadOrNew(key, func() (caddy.Destructor, error) {
		ps, ok := b.Store.(*postgres.Store)
		if !ok {
			return nil, errors.New("the store is not the PostgreSQL store")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		q, err := pgqueue.New(ctx, ps, pgqueue.Options{Batch: pgqueue.BatchOptions{Observe: observeBatch}})
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
	if err != nil {
		return nil, err
	}
	qb, ok := val.(*queueBackend)
	if !ok {
		return nil, errors.New("queue pool holds an unexpected value")
	}
	return qb, nil
}
