package caddymodule

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The redelivery benchmarks (BenchmarkServeHTTPDuplicateCached in
// handler_bench_test.go and the replay ones here) share benchRedelivery:
// the same 2 KB Stripe event, the same logger, the first delivery answered
// with a 100-byte TwiML-sized body, then its redeliveries measured.

// BenchmarkServeHTTPReplayCached is BenchmarkServeHTTPDuplicateCached with
// replay response: the stored answer comes from the cache.
func BenchmarkServeHTTPReplayCached(b *testing.B) { benchRedelivery(b, "response", true) }

// BenchmarkServeHTTPDuplicateStore is the short duplicate answer with the
// cache off: one claim statement in SQLite per redelivery.
func BenchmarkServeHTTPDuplicateStore(b *testing.B) { benchRedelivery(b, "short", false) }

// BenchmarkServeHTTPReplayStore is replay response with the cache off: the
// claim statement, then the read of the stored answer.
func BenchmarkServeHTTPReplayStore(b *testing.B) { benchRedelivery(b, "response", false) }

// replayBenchAnswer is the upstream's answer to the first delivery.
const replayBenchAnswer = `<?xml version="1.0" encoding="UTF-8"?><Response><Message>Order 1042 confirmed</Message></Response>`

func benchRedelivery(b *testing.B, replay string, cached bool) {
	const secret = "whsec_bench"
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel) // after the handler's Cleanup (b.Cleanup runs last-in first-out)
	h := &Handler{
		Provider: "stripe",
		Secrets:  []string{secret},
		Storage:  &Storage{Backend: "sqlite", Path: filepath.Join(b.TempDir(), "events.db")},
	}
	h.Replay = replay
	if !cached {
		zero := 0
		h.Cache = &zero
	}
	provisionBench(b, ctx, h)
	body := benchPayload(b)
	rb := &rewindBody{}
	r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/webhooks/stripe", rb)
	if err != nil {
		b.Fatal(err)
	}
	// The replacer Caddy's server gives every request: the handler sets
	// its placeholders on it (the event ID's costs an allocation).
	repl := caddy.NewReplacer()
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	r.Header.Set("Stripe-Signature", stripeHeader(secret, body, time.Now().Unix()))
	w := &discardWriter{h: http.Header{}}
	serve := func(next caddyhttp.Handler) {
		rb.Reset(body)
		r.Body, r.ContentLength = rb, int64(len(body))
		// A server gives each request a replacer of its own: the mark set
		// by the last iteration would read as a handler of the scope
		// before this one (Handler.enter).
		repl.Delete(h.budget.enteredKey)
		clear(w.h)
		w.status = 0
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}

	serve(caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/xml")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, replayBenchAnswer)
		return nil
	}))
	if w.status != http.StatusOK {
		b.Fatalf("first delivery: status %d", w.status)
	}
	const id = benchEventID
	for deadline := time.Now().Add(5 * time.Second); cached; time.Sleep(time.Millisecond) {
		_, okStatus := h.completed.Has(h.Scope, id)
		_, okResp := h.completed.Response(h.Scope, id)
		if (replay == "response" && okResp) || (replay != "response" && okStatus) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the completed event never reached the cache")
		}
	}

	never := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		b.Fatal("duplicate forwarded")
		return nil
	})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		serve(never)
	}
	if w.status != http.StatusOK || w.h.Get("Idempotent-Replayed") != "true" {
		b.Fatalf("not answered as a duplicate: status %d", w.status)
	}
	if replay == "response" && w.h.Get("Content-Type") != "text/xml" {
		b.Fatalf("not the replayed answer: %v", w.h)
	}
}

// provisionBench provisions and validates h for a benchmark, cleaned up
// when it ends, with Caddy's default logger (info, JSON) into io.Discard:
// the log line's encoding is counted, not a terminal.
func provisionBench(b *testing.B, ctx caddy.Context, h *Handler) {
	b.Helper()
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Cleanup() })
	if err := h.Validate(); err != nil {
		b.Fatal(err)
	}
	h.logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard), zapcore.InfoLevel))
}

// benchPayload is the benchmarks' delivery: a 2 KB Stripe event whose ID
// is benchEventID.
func benchPayload(b *testing.B) []byte {
	b.Helper()
	body, err := os.ReadFile("../examples/payloads/stripe_payment_intent_succeeded.json")
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// benchEventID is the event ID of benchPayload.
const benchEventID = "evt_3SigVecPI00000000000001"
