package caddymodule

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkServeHTTPNewEvent is a new event's whole path in the handler:
// verify, extract the ID, claim it in the store, forward it to next (which
// reads the body and answers 200), settle the claim, log the delivery. Each
// iteration is a new event ID, signed while the timer is stopped. The
// settle is written after the answer, as in a server, so the store work of
// one iteration overlaps the next; allocations are the handler's and its
// store's per event.
func BenchmarkServeHTTPNewEvent(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) {
		benchNewEvent(b, &Storage{Backend: "sqlite", Path: filepath.Join(b.TempDir(), "events.db")})
	})
	b.Run("postgres", func(b *testing.B) {
		dsn := pgDSN(b)
		table := fmt.Sprintf("bench_new_%d", time.Now().UnixNano())
		b.Cleanup(func() { dropTable(dsn, table) })
		benchNewEvent(b, &Storage{Backend: "postgres", DSN: dsn, Table: table})
	})
}

func benchNewEvent(b *testing.B, st *Storage) {
	const secret = "whsec_bench"
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel) // after the handler's Cleanup (b.Cleanup runs last-in first-out)
	h := &Handler{Provider: "stripe", Secrets: []string{secret}, Storage: st}
	provisionBench(b, ctx, h)
	tmpl := benchPayload(b)
	const id = benchEventID
	at := bytes.Index(tmpl, []byte(`"`+id+`"`)) + 1
	if at == 0 {
		b.Fatal("the payload's event ID was not found")
	}
	run := time.Now().UnixNano() % 1e9
	rb := &rewindBody{}
	w := &discardWriter{h: http.Header{}}
	var executions int
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.Copy(io.Discard, r.Body)
		executions++
		w.WriteHeader(http.StatusOK)
		return nil
	})
	body := bytes.Clone(tmpl)
	n := 0
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		n++
		copy(body[at:at+len(id)], fmt.Sprintf("evt_%09d%013d", run, n))
		rb.Reset(body)
		r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/webhooks/stripe", rb)
		if err != nil {
			b.Fatal(err)
		}
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Type", "application/json; charset=utf-8")
		r.Header.Set("Stripe-Signature", stripeHeader(secret, body, time.Now().Unix()))
		clear(w.h)
		w.status = 0
		b.StartTimer()
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
		if w.status != http.StatusOK {
			b.Fatalf("event %d: status %d", n, w.status)
		}
	}
	if executions != n {
		b.Fatalf("%d events, %d forwards", n, executions)
	}
}
