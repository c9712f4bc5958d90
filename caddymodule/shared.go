package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cache"
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
				Batch: store.BatchOptions{Observe: observeBatch}})
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
		return &backend{Store: s, completed: comp}, nil
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
