// Package queue is the durable queue of the gateway's async mode
// (store-and-forward): a verified delivery is stored whole, together with its
// claim, in one transaction, and answered at once; dispatchers on every
// gateway instance then deliver it to the upstream, retrying with backoff
// until it is delivered or dead.
//
// The PostgreSQL implementation lives in the postgres sub-package. Work is
// taken with SELECT ... FOR UPDATE SKIP LOCKED and held by a lease that the
// database's clock judges, so any number of instances can share one queue.
package queue

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// State is the lifecycle state of a queued event.
type State string

const (
	// StateQueued: waiting for its next attempt, not before RunAt.
	StateQueued State = "queued"
	// StateDelivering: a dispatcher holds it (lease until LeaseUntil) and is
	// delivering it.
	StateDelivering State = "delivering"
	// StateDelivered: the upstream answered 2xx.
	StateDelivered State = "delivered"
	// StateDead: it failed max_attempts times or for longer than max_age; it
	// stays until an operator retries or purges it, or retention ends.
	StateDead State = "dead"
)

// Valid reports whether s is one of the states.
func (s State) Valid() bool {
	switch s {
	case StateQueued, StateDelivering, StateDelivered, StateDead:
		return true
	}
	return false
}

// Outcome is what Enqueue decided.
type Outcome int

const (
	// Queued: the request and its claims are stored; answer the provider 200.
	Queued Outcome = iota + 1
	// Duplicate: the event was accepted before (queued, delivering,
	// delivered or dead), or a claim is completed; answer at the edge.
	Duplicate
	// InFlight: a claim is held by a live synchronous forward; answer 409.
	InFlight
	// Held: a claim is parked in the held state, or is an expired claim
	// under on_ambiguous hold; 503.
	Held
)

func (o Outcome) String() string {
	switch o {
	case Queued:
		return "queued"
	case Duplicate:
		return "duplicate"
	case InFlight:
		return "in_flight"
	case Held:
		return "held"
	}
	return "unknown"
}

// Request is what the upstream will get: the delivery as it arrived.
type Request struct {
	Method string
	// URI is the request URI (path and query) as the gateway received it.
	URI    string
	Header http.Header
	// Body is the raw body, byte for byte (still gzip-encoded if it came so).
	// Nil once dropped (keep_body, retention).
	Body []byte
}

// Key names one row of the events table (the claims of the sync mode).
type Key struct {
	Scope   string
	EventID string
}

// Entry is one event to enqueue.
type Entry struct {
	Scope   string
	EventID string
	// OrderKey: events of a scope sharing a non-empty key are delivered one
	// at a time, in the order they were enqueued.
	OrderKey string
	Request  Request
	// Claims are recorded in the events table in the same transaction, as
	// completed with ClaimStatus, so synchronous routes, the events admin
	// API and the cache see the event as accepted. The first is normally
	// (Scope, EventID); with dedupe_body the body hash follows. When one is
	// refused (completed, live, held) nothing is stored.
	Claims      []Key
	ClaimStatus int
	// HoldOnExpiry: a claim in processing whose lease expired is not taken
	// over (on_ambiguous hold): the store's rule parks it as held and the
	// event is answered Held. The parking is rolled back with the refused
	// enqueue; the next synchronous claim parks it for good.
	HoldOnExpiry bool
}

// Enqueued is the result of Enqueue.
type Enqueued struct {
	Outcome Outcome
	// ID is the queue row's ID (Queued).
	ID int64
	// Refused is the index in Entry.Claims of the claim that decided a
	// Duplicate, InFlight or Held outcome; -1 when the queue row itself was
	// found (an earlier delivery of the event was queued).
	Refused int
	// RetryAfter is the time left on a live claim (InFlight), at least 1s.
	RetryAfter time.Duration
}

// TakeParams ask for work of one scope.
type TakeParams struct {
	Scope string
	// Limit is the most events to take (the dispatcher's free workers).
	Limit int
	// MaxConcurrency caps the events of the scope in delivery with a live
	// lease, across every dispatcher sharing the database; 0: no cap.
	MaxConcurrency int
	// Rate and Per cap attempts started in any window of Per, across every
	// dispatcher; Rate 0: no cap.
	Rate int
	Per  time.Duration
	// Lease is how long a taken event stays held without a heartbeat.
	Lease time.Duration
	// MaxAttempts and MaxAge decide whether an event whose dispatcher died
	// (lease expired) is queued again or dead; 0: no limit.
	MaxAttempts int
	MaxAge      time.Duration
	// Worker names the taker in the attempts table (host and process).
	Worker string
}

// Batch is what Take got.
type Batch struct {
	Jobs []Job
	// Busy: the scope's MaxConcurrency is reached; RateLimited: its Rate.
	Busy, RateLimited bool
	// NextIn hints when work may be available: the earliest RunAt of a
	// queued event, or when the rate window frees a slot (0: unknown).
	NextIn time.Duration
	// Lost counts events taken back from dispatchers whose lease expired;
	// LostDead how many of those were dead (out of attempts or age).
	Lost, LostDead int
}

// Job is one taken event, held with Token until settled.
type Job struct {
	ID       int64
	Scope    string
	EventID  string
	OrderKey string
	Token    string
	// Attempt numbers this attempt among all of the event's attempts;
	// RoundAttempts counts the attempts since the event was (re)queued by
	// the provider or an operator, this one included (max_attempts, backoff).
	Attempt       int
	RoundAttempts int
	Request       Request
	ReceivedAt    time.Time
}

// Settlement is the outcome of one delivery attempt.
type Settlement struct {
	ID      int64
	Token   string
	Attempt int
	// Status is the upstream's HTTP status, 0 when there was no answer.
	Status int
	// Error says why the attempt failed ("" when delivered). Never a body.
	Error    string
	Duration time.Duration
	// Delivered: the upstream answered 2xx.
	Delivered bool
	// RetryIn is the delay before the next attempt when not delivered.
	RetryIn time.Duration
	// MaxAttempts and MaxAge: a failed event is dead when its round has
	// this many attempts, or its next attempt would be later than MaxAge
	// after the round began; 0: no limit.
	MaxAttempts int
	MaxAge      time.Duration
}

// Event is a queue row as operators see it (without the body).
type Event struct {
	ID            int64
	Scope         string
	EventID       string
	OrderKey      string
	State         State
	Attempts      int
	RoundAttempts int
	Method        string
	URI           string
	BodySize      int  // bytes; 0 once dropped
	BodyKept      bool // false once keep_body or retention dropped it
	ReceivedAt    time.Time
	UpdatedAt     time.Time
	RunAt         time.Time // next attempt not before (queued)
	LeaseUntil    time.Time // zero unless delivering
	DeliveredAt   time.Time // zero unless delivered
	LastStatus    int
	LastError     string
}

// Attempt is one recorded delivery attempt.
type Attempt struct {
	Attempt    int
	Worker     string
	StartedAt  time.Time
	FinishedAt time.Time // zero while delivering or when lost
	Duration   time.Duration
	Status     int
	Error      string
	// Outcome: delivering, delivered, retry, dead, lost (its dispatcher died
	// or lost its lease), released (handed back at shutdown, not counted).
	Outcome string
}

// Attempt outcomes.
const (
	AttemptDelivering = "delivering"
	AttemptDelivered  = "delivered"
	AttemptRetry      = "retry"
	AttemptDead       = "dead"
	AttemptLost       = "lost"
	AttemptReleased   = "released"
)

// ListQuery selects events for List, in ID (arrival) order.
type ListQuery struct {
	Scope   string // required
	State   State  // "" = any
	AfterID int64  // paging cursor (exclusive): the last ID of the previous page
	Limit   int    // default 100, at most 1000
}

// Stats describe a scope's queue.
type Stats struct {
	Queued, Delivering, Dead int
	// OldestAge is the age of the oldest event not yet delivered or dead
	// (queued or delivering), by the database clock; 0 when there is none.
	OldestAge time.Duration
}

// SweepParams select what retention removes from a scope.
type SweepParams struct {
	Scope string
	// Retention: delivered and dead events received longer ago are deleted
	// with their attempts. Queued events are never deleted by age.
	Retention time.Duration
	// KeepBody: delivered events delivered longer ago lose their body and
	// headers; 0 keeps them until Retention.
	KeepBody time.Duration
	// Limit is the most rows each statement touches.
	Limit int
}

// Errors returned by queues. Driver errors never escape a queue.
var (
	// ErrNotFound: no queued event for (scope, event ID).
	ErrNotFound = errors.New("queued event not found")
	// ErrLeaseLost: the event is no longer held with this token (its lease
	// expired and it was taken back, or an operator changed it).
	ErrLeaseLost = errors.New("queue lease lost")
	// ErrConflict: the event is in a state the operation does not apply to
	// (retrying a delivered event, purging one in delivery).
	ErrConflict = errors.New("queued event is in another state")
	// ErrPending: Conclude's wait for a transaction holding the event ran
	// out (the upstream is committing, or holds its transaction open); the
	// event is left in delivery, its lease runs out unless renewed, and it
	// is taken back only once that transaction has ended without
	// committing the delivery.
	ErrPending = errors.New("queued event held by an open transaction")
)

// Queue stores and hands out events. All methods are safe for concurrent
// use, also from several processes sharing one database.
type Queue interface {
	// Enqueue records the entry's claims and the entry in one transaction;
	// an event is enqueued at most once per (scope, event ID).
	Enqueue(ctx context.Context, e Entry) (Enqueued, error)
	// Take hands out at most p.Limit due events of a scope, within the
	// scope's concurrency and rate caps, and first takes back events whose
	// lease expired. Events sharing an order key are handed out one at a
	// time, oldest first.
	Take(ctx context.Context, p TakeParams) (Batch, error)
	// Heartbeat extends a taken event's lease to now + lease (database
	// clock), or returns ErrLeaseLost.
	Heartbeat(ctx context.Context, id int64, token string, lease time.Duration) error
	// Settle records the attempt and moves the event to delivered, queued
	// (at now + RetryIn) or dead, returning the new state; ErrLeaseLost if
	// the token no longer holds it (the attempt is recorded all the same).
	Settle(ctx context.Context, s Settlement) (State, error)
	// Conclude is Settle for a delivery the upstream completes in its own
	// transaction (complete_by upstream, QueueClaimValue): it waits at most
	// wait for a transaction holding the event, then settles by what the
	// row says: delivered by <table>_commit (committed true, whatever
	// s.Delivered says), else as Settle. ErrLeaseLost as Settle;
	// ErrPending when the wait ran out (nothing recorded).
	Conclude(ctx context.Context, s Settlement, wait time.Duration) (state State, committed bool, err error)
	// Release hands a taken event back without an answer (shutdown): it is
	// queued again at once and the attempt does not count.
	Release(ctx context.Context, id int64, token string, attempt int) error
	// Get returns one event, or ErrNotFound.
	Get(ctx context.Context, scope, eventID string) (Event, error)
	// Attempts returns an event's attempts, oldest first.
	Attempts(ctx context.Context, id int64) ([]Attempt, error)
	// List returns events of a scope in ID order.
	List(ctx context.Context, q ListQuery) ([]Event, error)
	// Retry makes a dead event due now with a fresh round (attempts and
	// max_age count from now), or a queued one due now. ErrNotFound,
	// ErrConflict (delivering, delivered).
	Retry(ctx context.Context, scope, eventID string) error
	// RetryDead makes every dead event of a scope due now with a fresh
	// round, and reports how many.
	RetryDead(ctx context.Context, scope string) (int, error)
	// Purge deletes one event that is not in delivery. ErrNotFound,
	// ErrConflict (delivering).
	Purge(ctx context.Context, scope, eventID string) error
	// PurgeState deletes every event of a scope in a state (not
	// delivering), and reports how many.
	PurgeState(ctx context.Context, scope string, state State) (int, error)
	// Stats counts a scope's events by state.
	Stats(ctx context.Context, scope string) (Stats, error)
	// Sweep applies retention and keep_body to a scope in bounded
	// statements, and reports how many rows it deleted and stripped.
	Sweep(ctx context.Context, p SweepParams) (deleted, stripped int, err error)
}
