package spool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Outcome is what one try of a spooled record came to.
type Outcome int

const (
	// Forwarded: the record's claim was won, the upstream took the
	// delivery (2xx) and the claim is completed. The record is settled.
	Forwarded Outcome = iota + 1
	// Duplicate: the event is completed (another delivery of it, live or
	// spooled, was forwarded). The record is settled without a forward.
	Duplicate
	// Wait: another claim on the event is live (a gateway is forwarding
	// it), or the event is held for an operator. Nothing was forwarded;
	// the record is tried again after Result.RetryAfter.
	Wait
	// Refused: the claim was won and released because the upstream did not
	// take the delivery (non-2xx, unreachable, no known outcome under
	// on_ambiguous reforward). The provider was answered 2xx long ago and
	// will not send it again, so the spool tries again, with backoff.
	Refused
	// Unavailable: the store could not be reached; nothing was claimed.
	// No record is tried until the store's retry wait has passed or Poke
	// says the store is back.
	Unavailable
	// NotReady: the Deliverer cannot deliver yet (its server is still
	// starting). No record is tried for Result.RetryAfter (at least 100ms).
	NotReady
)

func (o Outcome) String() string {
	switch o {
	case Forwarded:
		return "forwarded"
	case Duplicate:
		return "duplicate"
	case Wait:
		return "wait"
	case Refused:
		return "refused"
	case Unavailable:
		return "unavailable"
	case NotReady:
		return "not_ready"
	}
	return "none"
}

// Result is a Deliverer's answer for one record.
type Result struct {
	Outcome Outcome
	// RetryAfter is when a Wait record is tried again (at least 1s).
	RetryAfter time.Duration
}

// heldRetry is how often a record whose event is held is tried again: an
// operator's release or complete is picked up within it.
const heldRetry = 30 * time.Second

// ForClaim is what the outcome of a won-or-refused claim means for a
// spooled record, the same store rules as a live delivery's: a completed
// event is a Duplicate, a live claim elsewhere (409 to a live delivery)
// and a held event are a Wait, a store error is Unavailable. ok is false
// when the claim was won: the caller forwards and reports Forwarded or
// Refused.
func ForClaim(c store.Claim, err error) (r Result, ok bool) {
	if err != nil {
		return Result{Outcome: Unavailable}, true
	}
	switch c.Outcome {
	case store.Claimed:
		return Result{}, false
	case store.Duplicate:
		return Result{Outcome: Duplicate}, true
	case store.InFlight:
		return Result{Outcome: Wait, RetryAfter: c.RetryAfter}, true
	case store.Held:
		return Result{Outcome: Wait, RetryAfter: heldRetry}, true
	}
	return Result{Outcome: Unavailable}, true
}

// Deliverer tries one record: it claims the record's event through the
// store (ForClaim), and with a won claim forwards the request and settles
// the claim. ctx ends when the spool closes. Up to Options.Concurrency
// records are tried at once, started in arrival order among the records
// due; two records of one event never at once (the later one starts after
// the earlier one's try, and its claim then says Duplicate).
type Deliverer func(ctx context.Context, r *Record) Result

// attachment is an attached Deliverer (a pointer, so detach can tell
// whether it is still the one attached).
type attachment struct{ d Deliverer }

// Attach makes d the spool's Deliverer, replacing any other (a config
// reload attaches the new handler before the old one detaches), and starts
// deliveries. detach removes d if it is still the one attached.
func (s *Spool) Attach(d Deliverer) (detach func()) {
	a := &attachment{d: d}
	s.mu.Lock()
	s.deliverer = a
	s.mu.Unlock()
	s.poke()
	return func() {
		s.mu.Lock()
		if s.deliverer == a {
			s.deliverer = nil
		}
		s.mu.Unlock()
	}
}

// Poke tells the spool that the store answered (a live claim succeeded):
// a wait after Unavailable ends now.
func (s *Spool) Poke() {
	if !s.paused.Load() {
		return // the common case, on every live claim: no lock taken
	}
	s.mu.Lock()
	wasDown := !s.storeAfter.IsZero()
	s.storeAfter, s.storeWait = time.Time{}, 0
	s.paused.Store(false)
	s.mu.Unlock()
	if wasDown {
		s.poke()
	}
}

// poke wakes the delivery loop.
func (s *Spool) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run starts the records due, oldest first, each on a goroutine of its
// own, at most Options.Concurrency at once, until the spool closes.
func (s *Spool) run() {
	defer close(s.done)
	for {
		e, d, wait := s.next()
		if e == nil {
			var (
				t     *time.Timer
				timer <-chan time.Time
			)
			if wait > 0 {
				t = time.NewTimer(wait)
				timer = t.C
			}
			select {
			case <-s.ctx.Done():
			case <-s.wake:
			case <-timer:
			}
			if t != nil {
				t.Stop()
			}
			if s.ctx.Err() != nil {
				return
			}
			continue
		}
		go func() {
			s.try(e, d)
			s.mu.Lock()
			e.trying = false
			s.inFlight--
			delete(s.busy, e.key())
			s.mu.Unlock()
			s.poke()
		}()
	}
}

// key is the event e carries: two records with one key are never tried
// at once.
func (e *entry) key() string { return e.scope + "\x00" + e.eventID }

// next returns the oldest record due, marked as being tried, with the
// Deliverer to try it; or, when none is due, how long until one is (0:
// until woken, by an append, the end of a try, or Poke).
func (s *Spool) next() (*entry, Deliverer, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deliverer == nil || s.closed || s.live == 0 || s.inFlight >= s.o.Concurrency || s.probing && s.inFlight > 0 {
		return nil, nil, 0
	}
	now := s.o.Now()
	if now.Before(s.storeAfter) {
		return nil, nil, s.storeAfter.Sub(now)
	}
	if now.Before(s.pausedUntil) {
		return nil, nil, s.pausedUntil.Sub(now)
	}
	var soonest time.Time
	for _, e := range s.pending[s.head:] {
		if e.done || e.dead || e.trying || s.busy[e.key()] {
			continue
		}
		if !now.Before(e.notBefore) {
			e.trying = true
			s.inFlight++
			s.busy[e.key()] = true
			return e, s.deliverer.d, 0
		}
		if soonest.IsZero() || e.notBefore.Before(soonest) {
			soonest = e.notBefore
		}
	}
	if soonest.IsZero() {
		return nil, nil, 0
	}
	return nil, nil, max(soonest.Sub(now), time.Millisecond)
}

// try delivers one record and records the outcome.
func (s *Spool) try(e *entry, d Deliverer) {
	log := s.o.Logger.With(zap.String("scope", e.scope), zap.String("event_id", e.eventID), zap.Uint64("seq", e.seq))
	rec, err := s.read(e)
	if err != nil {
		if s.ctx.Err() != nil {
			return // closing: its file is closed; the next Open has it
		}
		log.Error("spool: a record no longer reads; it is dropped", zap.Error(err))
		s.drop(e)
		return
	}
	res := safeDeliver(s.ctx, d, rec, log)
	now := s.o.Now()
	s.mu.Lock()
	if res.Outcome == NotReady {
		s.pausedUntil = now.Add(max(res.RetryAfter, 100*time.Millisecond))
		s.probing = true
		s.mu.Unlock()
		return
	}
	s.probing = res.Outcome == Unavailable
	e.last = res.Outcome
	if res.Outcome != Unavailable {
		s.storeAfter, s.storeWait = time.Time{}, 0
		s.paused.Store(false)
	}
	switch res.Outcome {
	case Forwarded, Duplicate:
		if res.Outcome == Forwarded {
			s.counts.Forwarded++
		} else {
			s.counts.Duplicates++
		}
		s.mu.Unlock()
		if err := s.ack(e); err != nil {
			// Tried again later (or after the next Open): its claim
			// then says Duplicate.
			if !errors.Is(err, ErrClosed) {
				log.Warn("spool: acknowledging a settled record failed", zap.Error(err))
			}
			s.mu.Lock()
			e.notBefore = now.Add(s.o.RetryMin)
			s.mu.Unlock()
		}
		return
	case Wait:
		s.counts.Waits++
		e.notBefore = now.Add(max(res.RetryAfter, time.Second))
	case Refused:
		s.counts.Refused++
		e.attempts++
		if e.refused.IsZero() {
			e.refused = now
		}
		if since := now.Sub(e.refused); since >= s.o.DeadAfter {
			e.dead = true
			s.counts.Dead++
			log.Error("spool: the upstream has refused a spooled delivery for too long; it is set aside (dead): "+
				"kept, no longer tried; retry or drop it through the admin API (/webhook_idempotency/spool)",
				zap.Int("attempts", e.attempts), zap.Duration("refused_for", since.Round(time.Second)))
			break
		}
		wait := s.backoff(e.attempts)
		e.notBefore = now.Add(wait)
		log.Warn("spool: the upstream did not take a spooled delivery; trying again",
			zap.Int("attempts", e.attempts), zap.Duration("retry_in", wait))
	default: // Unavailable
		if !now.Before(s.storeAfter) { // the tries in flight together back off once
			s.storeWait = min(max(2*s.storeWait, s.o.StoreRetry), s.o.MaxStoreRetry)
			s.storeAfter = now.Add(s.storeWait)
		}
		s.paused.Store(true)
	}
	s.mu.Unlock()
}

// Retry makes dead records due now, with a new round of refusals before
// they are set aside again: the record seq, or every dead record when seq
// is 0. It returns how many.
func (s *Spool) Retry(seq uint64) int {
	s.mu.Lock()
	n := 0
	for _, e := range s.pending[s.head:] {
		if e.done || !e.dead || (seq != 0 && e.seq != seq) {
			continue
		}
		e.dead, e.refused, e.attempts, e.notBefore = false, time.Time{}, 0, time.Time{}
		n++
	}
	s.mu.Unlock()
	if n > 0 {
		s.poke()
	}
	return n
}

// Drop settles the dead record seq without delivering it: an operator's
// decision that its event will not be forwarded (logged with its scope
// and event ID). It returns the record as it was listed; ErrNoRecord when
// no waiting record has seq, ErrNotDead when it is not dead.
func (s *Spool) Drop(seq uint64) (Entry, error) {
	s.mu.Lock()
	var e *entry
	for _, x := range s.pending[s.head:] {
		if !x.done && x.seq == seq {
			e = x
			break
		}
	}
	switch {
	case e == nil:
		s.mu.Unlock()
		return Entry{}, ErrNoRecord
	case !e.dead || e.trying:
		s.mu.Unlock()
		return Entry{}, ErrNotDead
	}
	e.trying = true // not retried meanwhile
	listed := e.listed()
	s.mu.Unlock()
	err := s.ack(e)
	s.mu.Lock()
	e.trying = false
	if err == nil {
		s.counts.Dropped++
	}
	s.mu.Unlock()
	if err != nil {
		return Entry{}, err
	}
	s.o.Logger.Warn("spool: a dead spooled delivery was dropped by an operator; it will not be forwarded",
		zap.String("scope", listed.Scope), zap.String("event_id", listed.EventID), zap.Uint64("seq", seq),
		zap.Int("attempts", listed.Attempts))
	return listed, nil
}

// backoff is the wait after the n-th refusal: RetryMin doubled n-1 times,
// at most RetryMax.
func (s *Spool) backoff(n int) time.Duration {
	d := s.o.RetryMin
	for i := 1; i < n && d < s.o.RetryMax; i++ {
		d *= 2
	}
	return min(d, s.o.RetryMax)
}

// safeDeliver runs d, turning a panic into Refused (the claim, if any, is
// then left to its lease) so the spool's goroutine survives.
func safeDeliver(ctx context.Context, d Deliverer, r *Record, log *zap.Logger) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("spool: delivering a spooled record panicked", zap.String("panic", fmt.Sprint(p)))
			res = Result{Outcome: Refused}
		}
	}()
	res = d(ctx, r)
	if res.Outcome < Forwarded || res.Outcome > NotReady {
		res.Outcome = Unavailable
	}
	return res
}
