package caddymodule

// A store whose database could not be reached when the gateway started
// (storage.go opens it; docs/spool.md, "The store down at start"): the
// gateway starts without it, and a goroutine opens it (connection and
// migrations, as at start) with backoff until it succeeds. Until then every
// store call fails with errStoreNotReady, a store error like any other:
// a sync route's claim fails, so its delivery is spooled (spool on) or
// answered 503; async mode's enqueue is answered 503; the admin APIs
// answer 503. No claim is ever made against a schema that has not been
// migrated: the store is swapped in only once its migrations have run.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// errStoreNotReady is the error of every call to a store that has not been
// reached and migrated since the gateway started.
var errStoreNotReady = errors.New("the store is not ready")

// Backoff of the background open: the first retry after openRetryMin,
// doubling to openRetryMax (the spool's own wait on a store that is down),
// so deliveries go out within seconds of the store's return.
var (
	openRetryMin = time.Second
	openRetryMax = 5 * time.Second
)

// pendingStore is the store.Store (and store.Secrets) of a backend whose
// database was unreachable at start: every call goes to the opened store
// once it is ready, and fails with errStoreNotReady until then.
type pendingStore struct {
	desc   string // Storage.describe(): no password
	logger *zap.Logger

	ready   atomic.Pointer[opened]
	notYet  atomic.Pointer[error] // errStoreNotReady with the last reason
	readyCh chan struct{}         // closed once ready

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	done   chan struct{} // the opener has returned

	mu     sync.Mutex
	closed bool
}

// openLater starts opening the store in the background after first, the
// error of the open at start (one whose kind waits: the database was only
// unreachable). open is the backend kind's open; waits its test.
func openLater(c Storage, k *backendKind, first error, logger *zap.Logger) *pendingStore {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pendingStore{desc: c.describe(), logger: logger, readyCh: make(chan struct{}),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	p.fail(first)
	logger.Warn("the store is unreachable; the gateway starts without it and keeps trying in the background: "+
		"until it is reached and migrated, deliveries are spooled (spool on) or answered 503",
		zap.String("storage", p.desc), zap.Error(first))
	go p.run(c, k, time.Now())
	return p
}

// fail records why the store is not ready, for the errors of its calls.
func (p *pendingStore) fail(cause error) {
	err := fmt.Errorf("%w: %s has not been reached and migrated since the gateway started (last try: %v)",
		errStoreNotReady, p.desc, cause)
	p.notYet.Store(&err)
}

// run tries to open the store, with backoff, until it is open or the store
// is closed. It logs one warning per outage (openLater's) and an error
// once if the server, now reached, refuses the configuration (a password
// changed meanwhile): only an operator fixes that, and the tries go on.
func (p *pendingStore) run(c Storage, k *backendKind, since time.Time) {
	defer close(p.done)
	wait, refused := openRetryMin, false
	for {
		if !store.Sleep(p.ctx, wait) {
			return
		}
		ctx, cancel := context.WithTimeout(p.ctx, openTimeout)
		o, err := k.open(ctx, c)
		cancel()
		if err == nil {
			if p.opened(o) {
				p.logger.Info("the store is reached and migrated; claims resume and spooled deliveries go out",
					zap.String("storage", p.desc), zap.Duration("after", time.Since(since).Round(time.Millisecond)))
				pokeSpools()
			}
			return
		}
		if p.ctx.Err() != nil {
			return
		}
		p.fail(err)
		switch {
		case !k.waits(err) && !refused:
			refused = true
			p.logger.Error("the store's server answered but refused the gateway; fix the storage setting and reload",
				zap.String("storage", p.desc), zap.Error(err))
		default:
			if ce := p.logger.Check(zap.DebugLevel, "the store is still unreachable"); ce != nil {
				ce.Write(zap.String("storage", p.desc), zap.Duration("retry_in", wait), zap.Error(err))
			}
		}
		wait = min(2*wait, openRetryMax)
	}
}

// opened makes o the store, unless the pending store was closed meanwhile
// (then o is closed and false returned).
func (p *pendingStore) opened(o opened) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = o.store.Close()
		return false
	}
	p.ready.Store(&o)
	close(p.readyCh)
	return true
}

// store returns the opened store, or nil and the error of a call while it
// is not ready.
func (p *pendingStore) store() (store.Store, error) {
	if o := p.ready.Load(); o != nil {
		return o.store, nil
	}
	return nil, *p.notYet.Load()
}

// secrets returns the opened store's learned secrets (nil when it keeps
// none), or the error of a call while it is not ready.
func (p *pendingStore) secrets() (store.Secrets, error) {
	s, err := p.store()
	if err != nil {
		return nil, err
	}
	ss, ok := s.(store.Secrets)
	if !ok {
		return nil, errors.New("the store keeps no learned secrets")
	}
	return ss, nil
}

// Ready reports whether the store has been opened.
func (p *pendingStore) Ready() bool { return p.ready.Load() != nil }

// Close stops the background open and closes the store if it was opened.
func (p *pendingStore) Close() error {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if o := p.ready.Load(); o != nil {
		return o.store.Close()
	}
	return nil
}

// pokeSpools wakes every open spool: its deliveries waiting on the store go
// now rather than at the end of their backoff.
func pokeSpools() {
	openSpools.Range(func(_, v any) bool {
		v.(*pooledSpool).Poke()
		return true
	})
}

var (
	_ store.Store   = (*pendingStore)(nil)
	_ store.Secrets = (*pendingStore)(nil)
)

func (p *pendingStore) Claim(ctx context.Context, cp store.ClaimParams) (store.Claim, error) {
	s, err := p.store()
	if err != nil {
		return store.Claim{}, err
	}
	return s.Claim(ctx, cp)
}

func (p *pendingStore) Heartbeat(ctx context.Context, scope, eventID, token string, lease time.Duration) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.Heartbeat(ctx, scope, eventID, token, lease)
}

func (p *pendingStore) Complete(ctx context.Context, scope, eventID, token string, status int) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.Complete(ctx, scope, eventID, token, status)
}

func (p *pendingStore) CompleteResponse(ctx context.Context, scope, eventID, token string, resp store.Response) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.CompleteResponse(ctx, scope, eventID, token, resp)
}

func (p *pendingStore) Response(ctx context.Context, scope, eventID string) (store.Response, error) {
	s, err := p.store()
	if err != nil {
		return store.Response{}, err
	}
	return s.Response(ctx, scope, eventID)
}

func (p *pendingStore) Release(ctx context.Context, scope, eventID, token string) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.Release(ctx, scope, eventID, token)
}

func (p *pendingStore) ReleaseAmbiguous(ctx context.Context, scope, eventID, token string) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.ReleaseAmbiguous(ctx, scope, eventID, token)
}

func (p *pendingStore) Hold(ctx context.Context, scope, eventID, token, reason string) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.Hold(ctx, scope, eventID, token, reason)
}

func (p *pendingStore) Get(ctx context.Context, scope, eventID string) (store.Event, error) {
	s, err := p.store()
	if err != nil {
		return store.Event{}, err
	}
	return s.Get(ctx, scope, eventID)
}

func (p *pendingStore) Forget(ctx context.Context, scope, eventID string) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.Forget(ctx, scope, eventID)
}

func (p *pendingStore) Resolve(ctx context.Context, scope, eventID string, to store.State) error {
	s, err := p.store()
	if err != nil {
		return err
	}
	return s.Resolve(ctx, scope, eventID, to)
}

func (p *pendingStore) List(ctx context.Context, q store.ListQuery) ([]store.Event, error) {
	s, err := p.store()
	if err != nil {
		return nil, err
	}
	return s.List(ctx, q)
}

func (p *pendingStore) DeleteBefore(ctx context.Context, scopes []string, cutoff time.Time, limit int) (int, error) {
	s, err := p.store()
	if err != nil {
		return 0, err
	}
	return s.DeleteBefore(ctx, scopes, cutoff, limit)
}

func (p *pendingStore) LearnSecret(ctx context.Context, l store.Learn) error {
	s, err := p.secrets()
	if err != nil {
		return err
	}
	return s.LearnSecret(ctx, l)
}

func (p *pendingStore) LearnedSecret(ctx context.Context, scope string) (store.LearnedSecret, error) {
	s, err := p.secrets()
	if err != nil {
		return store.LearnedSecret{}, err
	}
	return s.LearnedSecret(ctx, scope)
}

func (p *pendingStore) LearnedSecrets(ctx context.Context) ([]store.LearnedSecret, error) {
	s, err := p.secrets()
	if err != nil {
		return nil, err
	}
	return s.LearnedSecrets(ctx)
}

func (p *pendingStore) ForgetLearnedSecret(ctx context.Context, scope string) error {
	s, err := p.secrets()
	if err != nil {
		return err
	}
	return s.ForgetLearnedSecret(ctx, scope)
}

func (p *pendingStore) RouteLoaded(ctx context.Context, scope string, now time.Time, window time.Duration) error {
	s, err := p.secrets()
	if err != nil {
		return err
	}
	return s.RouteLoaded(ctx, scope, now, window)
}

func (p *pendingStore) Enroll(ctx context.Context, scope string, until time.Time) error {
	s, err := p.secrets()
	if err != nil {
		return err
	}
	return s.Enroll(ctx, scope, until)
}
