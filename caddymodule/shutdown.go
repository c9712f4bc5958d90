package caddymodule

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
)

// A forward outlives its provider's connection and its config: it is
// bounded by forward_timeout, and a reload lets it finish and settle (the
// old config's store stays open until then, see Cleanup). Only the
// process's exit cuts it. When Caddy exits past its grace period, the
// forwards still running would end with the process and leave their
// events processing until their leases expired, then be forwarded again
// (or held) by whichever delivery came next. Instead the exit cuts them
// here, before the process ends, and each is settled as ambiguous at once
// by its route's on_ambiguous: held, or released (counted as an ambiguous
// ending on the row).

// errShutdown is the cause of a forward cut by the process's exit.
var errShutdown = errors.New("caddy is exiting")

// exiting is canceled with errShutdown when the process exits; every
// forward of every config (a reload's old one included) watches it.
var exiting, exitNow = context.WithCancelCause(context.Background())

// forwards counts the forwards running in this process, of any config.
var forwards sync.WaitGroup

// trackForward counts one forward; the returned func ends it.
func trackForward() (done func()) {
	forwards.Add(1)
	return forwards.Done
}

// shutdownSettleFor bounds how long the exit waits for the forwards it
// cut to settle their claims (a store call each; the store's own timeout
// is storeTimeout).
const shutdownSettleFor = storeTimeout + time.Second

// shutdownForwards cuts every forward still running in the process and
// waits, at most shutdownSettleFor, for their settles. Caddy calls the
// handlers' Cleanup after its servers' grace period, so what runs now is
// past it. Idempotent: every handler's Cleanup calls it on exit.
func shutdownForwards(logger *zap.Logger) {
	exitNow(errShutdown)
	done := make(chan struct{})
	go func() {
		forwards.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(shutdownSettleFor):
		logger.Warn("forwards cut by the exit did not settle in time; their events stay processing until their leases expire",
			zap.Duration("waited", shutdownSettleFor))
	}
}
