package caddymodule

// The body budget: a scope's routes hold at most body_budget bytes of
// request bodies at once, in memory and in temporary files together,
// counted from before a body is read until its request ends
// (delivery.done). The count is kept across config reloads (budgets), so
// the requests of the config being replaced and of the new one share it;
// its limit is the newest live config's. Bodies are
// read before their signature can be checked, so without a bound any
// sender could make the gateway hold max_body per connection it opens
// (disk, or RAM where the temporary directory is a tmpfs). A delivery that
// finds the budget spent is answered 503 with Retry-After: 1, and what it
// sent is not read any further.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// defaultBodyBudget is body_budget's default (1 GiB), raised to the least
// a route needs (minBodyBudget) when that is larger, so that a config valid
// before body_budget existed stays valid.
const defaultBodyBudget = 1 << 30

// budgetChunk is how much a body of unknown length (chunked, or HTTP/2
// without Content-Length) reserves at a time, and so the most a delivery
// may reserve beyond what it has read.
const budgetChunk = 64 << 10

// errBodyBudget is a body that could not be read on: its scope's
// body_budget is spent.
var errBodyBudget = errors.New("body budget spent")

// minBodyBudget is the least body_budget a route with maxBody can work
// with: one gzip delivery holds its compressed bytes (up to max_body) and
// its decoded bytes (up to max_body, reserved a chunk at a time), so a
// smaller budget would refuse such a delivery 503 on every try, even
// alone. It saturates rather than overflows for an absurd max_body.
func minBodyBudget(maxBody int64) int64 {
	if maxBody > (math.MaxInt64-budgetChunk)/2 {
		return math.MaxInt64
	}
	return 2*maxBody + budgetChunk
}

// budgets holds each scope's bodyBudget for the life of the process: a
// reload, or a route removed and added back, must find the bytes that the
// requests of the config before still hold, so a budget is never dropped
// and made anew while they run. A scope's entry is a few words; scopes
// are named by configs, so they are few.
var budgets = struct {
	sync.Mutex
	m   map[string]*bodyBudget
	seq uint64 // provisioning order of the handlers (bodyBudget.users)
}{m: map[string]*bodyBudget{}}

// budgetUser is a provisioned handler's claim on its scope's budget.
type budgetUser struct {
	seq   uint64
	limit int64
}

// bodyBudget counts the body bytes a scope's routes hold. Reservations
// are one compare-and-swap: no lock on the request path.
type bodyBudget struct {
	// limit is the body_budget of the newest live config (resetLimit).
	limit atomic.Int64
	held  atomic.Int64
	// heldBytes and refused are the scope's body_budget_held_bytes gauge
	// and body_budget_refused_total counter.
	heldBytes prometheus.Gauge
	refused   prometheus.Counter
	// users are the provisioned handlers not cleaned up yet, under
	// budgets' lock.
	users map[*Handler]budgetUser
	// enteredKey is the replacer key under which a handler of the scope
	// marks a request it took (Handler.enter).
	enteredKey string
}

// provisionBudget joins the scope's budget (made on first use): its limit
// becomes this config's body_budget while this handler is the scope's
// newest (routes of one config give their scope one value:
// useScopeStorage). After provisionMetrics.
func (h *Handler) provisionBudget() {
	budgets.Lock()
	defer budgets.Unlock()
	b := budgets.m[h.Scope]
	if b == nil {
		b = &bodyBudget{heldBytes: metrics.budgetHeld.WithLabelValues(h.Scope),
			refused: metrics.budgetRefuse.WithLabelValues(h.Scope), users: map[*Handler]budgetUser{},
			enteredKey: "http.webhook_idempotency.entered." + h.Scope}
		budgets.m[h.Scope] = b
	}
	budgets.seq++
	b.users[h] = budgetUser{seq: budgets.seq, limit: h.BodyBudget}
	b.resetLimit()
	h.budget = b
}

// cleanupBudget leaves the scope's budget: a config refused after this
// handler was provisioned, or replaced by a reload, no longer sets its
// limit. The bytes its requests still hold return to the same budget when
// they end.
func (h *Handler) cleanupBudget() {
	if h.budget == nil {
		return
	}
	budgets.Lock()
	defer budgets.Unlock()
	delete(h.budget.users, h)
	h.budget.resetLimit()
}

// resetLimit sets the limit to the newest user's body_budget; with no user
// left it keeps the last one (the requests still running were admitted
// under it). Under budgets' lock.
func (b *bodyBudget) resetLimit() {
	var newest budgetUser
	for _, u := range b.users {
		if u.seq > newest.seq {
			newest = u
		}
	}
	if newest.seq > 0 {
		b.limit.Store(newest.limit)
	}
}

// take reserves n bytes, or reports false when they would pass the limit.
func (b *bodyBudget) take(n int64) bool {
	for {
		cur := b.held.Load()
		if cur+n > b.limit.Load() {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			b.heldBytes.Add(float64(n))
			return true
		}
	}
}

// give returns n reserved bytes.
func (b *bodyBudget) give(n int64) {
	b.held.Add(-n)
	b.heldBytes.Sub(float64(n))
}

// reserve reserves n more bytes for the delivery, returned by done.
func (d *delivery) reserve(n int64) bool {
	if n <= 0 {
		return true
	}
	if !d.h.budget.take(n) {
		return false
	}
	d.reserved += n
	return true
}

// bodyMeter reads a body of unknown length (or a gzip body's decoded
// bytes), reserving budgetChunk at a time before reading it, at most
// limit in all: past limit it reads on unreserved (its caller stops one
// byte past limit and refuses the body as over max_body).
type bodyMeter struct {
	src io.Reader
	d   *delivery
	// read is what src gave; room what was reserved for it.
	read, room, limit int64
}

// meter starts metering src for the delivery, at most limit bytes
// reserved.
func (d *delivery) meter(src io.Reader, limit int64) io.Reader {
	d.bodyMeter = bodyMeter{src: src, d: d, limit: limit}
	return &d.bodyMeter // a field of the pooled delivery: no allocation
}

func (m *bodyMeter) Read(p []byte) (int, error) {
	if m.read == m.room && m.room < m.limit {
		grow := min(budgetChunk, m.limit-m.room)
		if !m.d.reserve(grow) {
			return 0, errBodyBudget
		}
		m.room += grow
	}
	if left := m.room - m.read; left > 0 && int64(len(p)) > left {
		p = p[:left]
	}
	n, err := m.src.Read(p)
	m.read += int64(n)
	return n, err
}

// refuseBudget counts a delivery refused for the budget, warns
// (throttled), and returns its answer. The warning names the scope and
// sizes only (held: by the other deliveries, this one's reservation left
// out): the delivery is unauthenticated, so nothing it sent is repeated.
// Its body is not read on (answer bounds the reading of the rest).
func (h *Handler) refuseBudget(d *delivery) answerID {
	h.budget.refused.Inc()
	h.warnThrottled("body_budget spent: answered 503 with Retry-After, the body not read on, nothing claimed nor forwarded",
		zap.String("scope", h.Scope), zap.Int64("content_length", d.r.ContentLength),
		zap.Int64("held", h.budget.held.Load()-d.reserved), zap.Int64("body_budget", h.budget.limit.Load()))
	return ansBodyBudget
}

// checkBodyBudget checks body_budget against max_body (part of
// checkConfig): below minBodyBudget, a gzip delivery of max_body could
// never be read, and would be refused 503 every time.
func (h *Handler) checkBodyBudget() error {
	if h.BodyBudget < 0 {
		return errors.New("body_budget: must be positive")
	}
	if need := minBodyBudget(h.MaxBody); h.BodyBudget < need {
		return fmt.Errorf("body_budget: %s is less than twice max_body (%s) and 64 KiB, what one gzip delivery of max_body holds (its compressed and its decoded bytes), so such a delivery would be answered 503 every time; write body_budget %s or more (JSON \"body_budget\": %d), or lower max_body",
			sizeText(h.BodyBudget), sizeText(h.MaxBody), sizeArg(need), need)
	}
	return nil
}

// sizeText is n in bytes, with its binary size when it is a whole number
// of KiB: "2097152 bytes (2MiB)".
func sizeText(n int64) string {
	if a := sizeArg(n); a != fmt.Sprint(n) {
		return fmt.Sprintf("%d bytes (%s)", n, a)
	}
	return fmt.Sprintf("%d bytes", n)
}

// sizeArg is n as a Caddyfile size: whole GiB, MiB or KiB when it is one,
// else bytes.
func sizeArg(n int64) string {
	for _, u := range []struct {
		unit string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.unit)
		}
	}
	return fmt.Sprint(n)
}
