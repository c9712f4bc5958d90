package caddymodule

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// rewindBody is a request body that can be replayed without allocating, so
// the benchmark counts only the handler's allocations.
type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

// discardWriter is a ResponseWriter whose header map is reused.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }

// BenchmarkServeHTTPDuplicateCached is the redelivery of a completed event
// whose completion is in the in-memory cache: verify, extract the ID, answer
// 200 at the edge, log the delivery. The store is never asked and next is
// never called. The logger is Caddy's default (info, JSON) into io.Discard,
// so the log line's encoding is counted but not the terminal.
func BenchmarkServeHTTPDuplicateCached(b *testing.B) {
	const secret = "whsec_bench"
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &Handler{
		Provider: "stripe",
		Secrets:  []string{secret},
		Storage:  &Storage{Backend: "sqlite", Path: filepath.Join(b.TempDir(), "events.db")},
	}
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = h.Cleanup() }()
	if err := h.Validate(); err != nil {
		b.Fatal(err)
	}
	h.logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard), zapcore.InfoLevel))

	tmpl, err := os.ReadFile("../examples/payloads/stripe_payment_intent_succeeded.json")
	if err != nil {
		b.Fatal(err)
	}
	body := tmpl
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	rb := &rewindBody{}
	r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/webhooks/stripe", rb)
	if err != nil {
		b.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	r.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
	w := &discardWriter{h: http.Header{}}
	serve := func(next caddyhttp.Handler) {
		rb.Reset(body)
		r.Body, r.ContentLength = rb, int64(len(body))
		clear(w.h)
		w.status = 0
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}

	// The first delivery is forwarded and completes the event.
	serve(caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
		return nil
	}))
	if w.status != http.StatusOK {
		b.Fatalf("first delivery: status %d", w.status)
	}
	// ristretto applies writes asynchronously.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := h.completed.Has(h.Scope, "evt_3SigVecPI00000000000001"); ok {
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
		b.Fatalf("not answered as a cached duplicate: status %d", w.status)
	}
}
