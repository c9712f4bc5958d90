package caddymodule

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// readLogLines returns the JSON lines of Caddy's log file, raw and decoded.
func readLogLines(t *testing.T, path string) ([]string, []map[string]any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	require.NoError(t, err)
	var (
		raw     []string
		decoded []map[string]any
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "not a JSON log line: %s", line)
		raw = append(raw, line)
		decoded = append(decoded, m)
	}
	require.NoError(t, sc.Err())
	return raw, decoded
}

// TestDeliveryLogs runs the handler in Caddy with the default log written as
// JSON to a file, and reads what the handler logged: one "delivery" line per
// request with its fields, and never a secret, signature or body.
func TestDeliveryLogs(t *testing.T) {
	current, previous := "whsec_current_"+randomHex(16), "whsec_previous_"+randomHex(16)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	g := startOpsGateway(t, opsConfig{secrets: []string{current, previous}, logFile: logFile})

	marker := "body_marker_" + randomHex(12)
	var sigHeaders []string
	deliver := func(id, secret string) result {
		t.Helper()
		req := stripeRequest(t, g.url, secret, stripeBody(id, marker), time.Now(), id)
		sigHeaders = append(sigHeaders, req.Header.Get("Stripe-Signature"))
		return send(t, req)
	}
	first, failing := "evt_log_"+randomHex(6), "evt_log_"+randomHex(6)

	require.Equal(t, 200, deliver(first, previous).status) // rotation: the second secret verifies
	require.True(t, deliver(first, current).replayed)
	require.Equal(t, 400, deliver(first, "whsec_stranger_"+randomHex(8)).status)
	g.up.answer(failing, http.StatusBadGateway)
	require.Equal(t, http.StatusBadGateway, deliver(failing, current).status)
	// An operator forgets the first event: the admin API logs it.
	require.Equal(t, http.StatusOK, adminDo(t, http.MethodDelete, eventPath(g.scope, first)+"?confirm="+first).status)

	type want struct {
		eventID, outcome string
		attempt, status  float64
	}
	wants := []want{
		{first, outcomeCompleted, 1, 200},
		{first, outcomeDuplicate, 0, 200},
		{"", outcomeInvalidSignature, 0, 0},
		{failing, outcomeReleased, 1, http.StatusBadGateway},
	}

	// The line is written as the handler returns, which may be just after
	// the client has its answer.
	var raw []string
	var deliveries, operator []map[string]any
	for deadline := time.Now().Add(5 * time.Second); ; {
		var lines []map[string]any
		raw, lines = readLogLines(t, logFile)
		deliveries, operator = deliveries[:0], operator[:0]
		for _, l := range lines {
			switch {
			case l["logger"] == "http.handlers.webhook_idempotency" && l["msg"] == "delivery":
				deliveries = append(deliveries, l)
			case l["logger"] == "admin.api.webhook_idempotency" && l["msg"] != "admin call":
				operator = append(operator, l)
			}
		}
		if len(deliveries) >= len(wants) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Len(t, deliveries, len(wants), "one delivery line per request")
	for i, w := range wants {
		// Lines are written as handlers return, not necessarily in the
		// order the answers reached the client: find each by what it says.
		var l map[string]any
		for _, d := range deliveries {
			if d["event_id"] == w.eventID && d["outcome"] == w.outcome {
				require.Nil(t, l, "two lines for %s %s", w.eventID, w.outcome)
				l = d
			}
		}
		require.NotNil(t, l, "no delivery line for %s %s", w.eventID, w.outcome)
		require.Equal(t, "info", l["level"], "line %d", i)
		require.Equal(t, g.scope, l["scope"], "line %d", i)
		require.Equal(t, "stripe", l["provider"], "line %d", i)
		require.Equal(t, w.eventID, l["event_id"], "line %d", i)
		require.Equal(t, w.outcome, l["outcome"], "line %d", i)
		if w.outcome == outcomeDuplicate {
			// Answered from the cache (no attempt count) or by the store
			// (the attempts so far): either way not a new attempt.
			require.Contains(t, []any{0.0, 1.0}, l["attempt"], "line %d", i)
		} else {
			require.Equal(t, w.attempt, l["attempt"], "line %d", i)
		}
		require.Equal(t, w.status, l["status"], "line %d", i)
		require.Contains(t, l, "duration", "line %d", i)
		require.IsType(t, 0.0, l["duration"], "line %d: duration in seconds", i)
	}

	// Who made the change: the admin API logs every call that is not a
	// GET with the caller's address (and, over mTLS, its certificate).
	calls := 0
	for _, line := range raw {
		if strings.Contains(line, `"msg":"admin call"`) {
			calls++
			require.Contains(t, line, `"method":"DELETE"`)
			require.Contains(t, line, `"status":200`)
			require.Contains(t, line, `"remote_addr":"127.0.0.1:`)
		}
	}
	require.Equal(t, 1, calls, "one admin call line")
	require.Len(t, operator, 1, "the forget is logged")
	require.Equal(t, "event forgotten by operator", operator[0]["msg"])
	require.Equal(t, g.scope, operator[0]["scope"])
	require.Equal(t, first, operator[0]["event_id"])

	// Nothing secret anywhere in the log, from any logger.
	require.NotEmpty(t, raw)
	secrets := append([]string{current, previous, marker}, sigHeaders...)
	for _, h := range sigHeaders {
		_, v1, ok := strings.Cut(h, "v1=")
		require.True(t, ok)
		secrets = append(secrets, v1) // the bare signature
	}
	for _, line := range raw {
		for _, s := range secrets {
			require.NotContains(t, line, s)
		}
		require.NotContains(t, line, "payment_intent.succeeded", "body content")
	}
}

// A cached duplicate's event ID placeholder is the delivery's event ID, a
// string, although its value is the one the cache made when it learned the
// event (cache.Entry.ID); a new event's is its own.
func TestEventIDPlaceholderOfCachedDuplicate(t *testing.T) {
	g := newGateway(t, "webhook_idempotency {\nprovider stripe\nsecret whsec_x\n}")
	deliver := func(id string) (answer, any) {
		req := withReplacer(stripeDelivery(t, "http://gateway.test/webhooks/stripe", "whsec_x", id, g.clock.Now()))
		a := g.serve(req)
		v, ok := req.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer).Get(placeholderEventID)
		require.True(t, ok)
		return a, v
	}
	a, v := deliver("evt_cached_1")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, "evt_cached_1", v)
	require.Eventually(t, func() bool {
		_, ok := g.h.completed.Has(g.h.Scope, "evt_cached_1")
		return ok
	}, 5*time.Second, 10*time.Millisecond, "the cache learns the completed event")

	a, v = deliver("evt_cached_1")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, "evt_cached_1", v)
	a, v = deliver("evt_cached_2")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, "evt_cached_2", v)
	lines := g.deliveryLog()
	require.Len(t, lines, 3)
	require.Equal(t, []any{false, true, false}, []any{lines[0]["cached"], lines[1]["cached"], lines[2]["cached"]})
	require.Equal(t, 2, g.up.count(), "the duplicate answered from the cache")
}

// A throttled warning's lines add up to every occurrence: the first is
// written at once, what followed within the second a second after it, in
// one line with the latest occurrence's fields; a quiet second later, the
// next is written at once again.
func TestWarnThrottledCountsEveryOccurrence(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	h := &Handler{logger: zap.New(core), throttled: new(sync.Map)}
	lines := func() []observer.LoggedEntry { return logs.FilterMessage("flood").All() }
	for n := range 50 {
		h.warnThrottled("flood", zap.Int("n", n))
	}
	require.Len(t, lines(), 1, "one line at once")
	require.Eventually(t, func() bool { return len(lines()) == 2 }, 5*time.Second, 20*time.Millisecond,
		"the rest a second later")
	var sum int64
	for _, e := range lines() {
		require.Equal(t, zapcore.WarnLevel, e.Level)
		sum += e.ContextMap()["times"].(int64)
	}
	require.Equal(t, int64(50), sum, "the lines count every occurrence")
	require.Equal(t, int64(49), lines()[1].ContextMap()["n"], "the latest occurrence's fields")

	time.Sleep(1200 * time.Millisecond)
	require.Len(t, lines(), 2, "nothing written when nothing happened")
	h.warnThrottled("flood", zap.Int("n", 50))
	require.Len(t, lines(), 3, "after a quiet second, at once")
	require.Equal(t, int64(1), lines()[2].ContextMap()["times"])
}

// Under a steady flood from several goroutines the throttled lines stay a
// second apart: the trailing line's timer, firing while an occurrence
// holds the lock, wrote a second line microseconds after the one that
// occurrence wrote (a trial: 2 of 5 floods).
func TestWarnThrottledLinesStayASecondApart(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	h := &Handler{logger: zap.New(core), throttled: new(sync.Map)}
	var (
		wg    sync.WaitGroup
		total atomic.Int64
	)
	stop := time.Now().Add(2500 * time.Millisecond)
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				h.warnThrottled("flood")
				total.Add(1)
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		var sum int64
		for _, e := range logs.FilterMessage("flood").All() {
			sum += e.ContextMap()["times"].(int64)
		}
		return sum == total.Load()
	}, 5*time.Second, 20*time.Millisecond, "the lines count every occurrence")
	lines := logs.FilterMessage("flood").All()
	require.GreaterOrEqual(t, len(lines), 3)
	for k := 1; k < len(lines); k++ {
		require.GreaterOrEqual(t, lines[k].Time.Sub(lines[k-1].Time), 990*time.Millisecond, "line %d", k)
	}
}
