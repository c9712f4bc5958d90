package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// The edge cases the README decides (its "Edge cases" section), one test each.

// TestEdge_ForwardDetachedFromProviderDisconnect: the provider hanging up
// mid-forward cancels nothing; the forward runs on, bounded by
// forward_timeout, and settles on the upstream's real answer.
func TestEdge_ForwardDetachedFromProviderDisconnect(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, backend gatewayOption) {
		const secret = "whsec_edge_detach"
		up := newUpstream()
		up.entered = make(chan int, 10)
		proceed := make(chan struct{})
		var ctxErrAtAnswer error
		up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
			<-proceed
			ctxErrAtAnswer = r.Context().Err()
			return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
		}
		g := newGateway(t, `webhook_idempotency {
			provider stripe
			secret whsec_edge_detach
			forward_timeout 2m
		}`, backend, withUpstream(up))
		body := []byte(`{"id":"evt_edge_detach","object":"event"}`)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req := withReplacer(g.stripe(secret, body, g.clock.Unix()).WithContext(ctx))
		done := make(chan answer, 1)
		go func() { done <- g.serve(req) }()
		<-up.entered
		cancel() // the provider times out and disconnects
		close(proceed)
		a := <-done
		require.NoError(t, ctxErrAtAnswer, "the upstream call was not cancelled with the provider's connection")
		requireRelayed(t, a)
		c := up.call(t, 0)
		require.NoError(t, c.CtxErr)
		require.WithinDuration(t, c.Entered.Add(2*time.Minute), c.Deadline, 5*time.Second, "bounded by forward_timeout")
		g.requireRow("stripe", "evt_edge_detach", store.StateCompleted)
		// The provider's retry finds the event completed.
		requireDuplicate(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
		require.Equal(t, 1, up.count())
	})
}

// TestEdge_ForwardTimeoutEndsTheForward: forward_timeout is the upper bound
// of one forward; with the default on_ambiguous reforward the claim is
// released and the next delivery is forwarded.
func TestEdge_ForwardTimeoutEndsTheForward(t *testing.T) {
	t.Parallel()
	const secret = "whsec_edge_timeout"
	up := newUpstream()
	up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
		if n == 1 {
			return blockUntilDone(w, r, n)
		}
		return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
	}
	g := newGateway(t, `webhook_idempotency {
		provider stripe
		secret whsec_edge_timeout
		forward_timeout 200ms
	}`, withUpstream(up))
	body := []byte(`{"id":"evt_edge_timeout","object":"event"}`)
	start := time.Now()
	a := g.serve(g.stripe(secret, body, g.clock.Unix()))
	took := time.Since(start)
	require.Equal(t, http.StatusGatewayTimeout, a.status)
	require.NoError(t, a.err, "upstream errors are answered by the handler, not logged by Caddy with the headers")
	require.JSONEq(t, `{"error":"upstream unavailable"}`, string(a.body))
	require.GreaterOrEqual(t, took, 200*time.Millisecond)
	require.Less(t, took, 10*time.Second)
	require.ErrorIs(t, up.call(t, 0).CtxErr, context.DeadlineExceeded)
	g.requireRow("stripe", "evt_edge_timeout", store.StateReleased)
	requireRelayed(t, g.serve(g.stripe(secret, body, g.clock.Unix())))
	require.Equal(t, 2, up.count())
	g.requireRow("stripe", "evt_edge_timeout", store.StateCompleted)
}

// TestEdge_OnAmbiguousHoldParksBodyToo: with dedupe_body, an ambiguous
// forward holds the body as well, so the same body under a fresh delivery
// ID is not forwarded either.
func TestEdge_OnAmbiguousHoldParksBodyToo(t *testing.T) {
	t.Parallel()
	const secret = "gh_edge_hold"
	up := newUpstream()
	up.respond = blockUntilDone
	scope := uniqueScope("edge_hold")
	g := newGateway(t, `webhook_idempotency {
		provider github
		secret gh_edge_hold
		scope `+scope+`
		lease 1s
		forward_timeout 200ms
		on_ambiguous hold
	}`, withUpstream(up))
	body := []byte(`{"action":"created","hook_id":77}`)
	const guid = "e0000000-0000-4000-8000-000000000001"
	a := g.serve(githubDelivery(secret, body, guid))
	require.Equal(t, http.StatusGatewayTimeout, a.status)
	require.Equal(t, 1.0, g.outcomes(outcomeAmbiguous))

	for _, id := range []string{guid, "e0000000-0000-4000-8000-000000000002"} {
		require.Eventually(t, func() bool {
			a = g.serve(githubDelivery(secret, body, id))
			require.Contains(t, []int{http.StatusConflict, http.StatusServiceUnavailable}, a.status, "%s", a.body)
			return a.status == http.StatusServiceUnavailable
		}, 5*time.Second, 50*time.Millisecond)
		requireRefused(t, a, http.StatusServiceUnavailable, "held")
		require.Empty(t, a.header.Get("Retry-After"), "nothing changes until an operator acts")
	}
	require.Equal(t, 1, up.count())
	// Held with the reason the log line gives, for the admin API.
	const why = "forward_timeout ended the forward before an upstream status arrived; the upstream may still be running the event"
	ev := g.requireRow(scope, guid, store.StateHeld)
	require.Equal(t, why, ev.HoldReason)
	require.Equal(t, why, toJSON(ev).HoldReason)
	require.Equal(t, why, g.logged("the event is held")[0].ContextMap()["reason"])
	require.Equal(t, why, g.requireRow(scope+"#body", bodyKey(body), store.StateHeld).HoldReason)
	require.GreaterOrEqual(t, g.outcomes(outcomeHeld), 2.0)
}

// TestEdge_DedupeBody: on by default for presets whose event ID is unsigned
// and that sign no timestamp; same body under a fresh ID is answered at the
// edge; the same ID with another body is a duplicate, warned and counted.
func TestEdge_DedupeBody(t *testing.T) {
	t.Parallel()
	const secret = "gh_edge_body"
	body := []byte(`{"action":"opened","number":1}`)

	t.Run("preset defaults", func(t *testing.T) {
		t.Parallel()
		for name, want := range map[string]bool{
			"github": true, "shopify": true, "gitlab": true, "bitbucket": true, "hmac": true,
			"stripe": false, "standard": false, "slack": false, "paddle": false, "square": false, "linear": false,
		} {
			p, ok := signature.Lookup(name)
			require.True(t, ok, name)
			require.Equal(t, want, p.DedupeBody, name)
		}
		g := newGateway(t, "webhook_idempotency {\n provider github\n secret x\n}")
		require.True(t, g.h.dedupeBody)
		g = newGateway(t, "webhook_idempotency {\n provider github\n secret x\n dedupe_body off\n}")
		require.False(t, g.h.dedupeBody)
		g = newGateway(t, "webhook_idempotency {\n provider stripe\n secret x\n dedupe_body on\n}")
		require.True(t, g.h.dedupeBody)
	})

	t.Run("same body, fresh delivery id", func(t *testing.T) {
		t.Parallel()
		eachBackend(t, func(t *testing.T, backend gatewayOption) {
			scope := uniqueScope("edge_body")
			g := newGateway(t, "webhook_idempotency {\n provider github\n secret "+secret+"\n scope "+scope+"\n}", backend)
			requireRelayed(t, g.serve(githubDelivery(secret, body, "d-1")))
			g.requireRow(scope+"#body", bodyKey(body), store.StateCompleted)
			requireDuplicate(t, g.serve(githubDelivery(secret, body, "d-2")))
			require.Equal(t, 1, g.up.count())
			require.Equal(t, 1.0, g.outcomes(outcomeBodyReplay))
			require.Len(t, g.logged("body already delivered under another event id"), 1)
		})
	})

	t.Run("same id, different body", func(t *testing.T) {
		t.Parallel()
		for _, cache := range []string{"cache 100", "cache 0"} {
			t.Run(cache, func(t *testing.T) {
				t.Parallel()
				scope := uniqueScope("edge_mismatch")
				g := newGateway(t, "webhook_idempotency {\n provider github\n secret "+secret+"\n scope "+scope+"\n "+cache+"\n}")
				requireRelayed(t, g.serve(githubDelivery(secret, body, "d-1")))
				mismatch := metrics.bodyMismatch.WithLabelValues(scope)
				// The same ID and body again: a plain duplicate, no mismatch.
				requireDuplicate(t, g.serve(githubDelivery(secret, body, "d-1")))
				require.Equal(t, 0.0, counterValue(t, mismatch))
				// Whether the duplicate is answered from the cache or the
				// store, a different body under the same ID is counted.
				for i := 1; i <= 3; i++ {
					other := []byte(fmt.Sprintf(`{"action":"opened","number":%d}`, 100+i))
					requireDuplicate(t, g.serve(githubDelivery(secret, other, "d-1")))
					require.Equal(t, float64(i), counterValue(t, mismatch), "delivery %d", i)
				}
				require.Equal(t, 1, g.up.count())
				warns := g.logged("completed event id arrived with a different body")
				require.Len(t, warns, 3)
				require.Equal(t, "d-1", warns[0].ContextMap()["event_id"])
			})
		}
	})

	t.Run("off: same body, fresh id forwarded", func(t *testing.T) {
		t.Parallel()
		g := newGateway(t, "webhook_idempotency {\n provider github\n secret "+secret+"\n dedupe_body off\n}")
		requireRelayed(t, g.serve(githubDelivery(secret, body, "d-1")))
		requireRelayed(t, g.serve(githubDelivery(secret, body, "d-2")))
		require.Equal(t, 2, g.up.count())
		_, err := g.row("github#body", bodyKey(body))
		require.ErrorIs(t, err, store.ErrNotFound)
	})

	t.Run("failed forward releases the body", func(t *testing.T) {
		t.Parallel()
		up := newUpstream()
		up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
			if n == 1 {
				return answerWith(http.StatusInternalServerError, "text/plain", "boom")(w, r, n)
			}
			return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
		}
		g := newGateway(t, "webhook_idempotency {\n provider github\n secret "+secret+"\n}", withUpstream(up))
		a := g.serve(githubDelivery(secret, body, "d-1"))
		require.Equal(t, http.StatusInternalServerError, a.status)
		g.requireRow("github#body", bodyKey(body), store.StateReleased)
		// A manual redelivery under a new ID is forwarded.
		requireRelayed(t, g.serve(githubDelivery(secret, body, "d-2")))
		require.Equal(t, 2, up.count())
		g.requireRow("github", "d-2", store.StateCompleted)
	})

	t.Run("body in flight under another id", func(t *testing.T) {
		t.Parallel()
		up := newUpstream()
		up.entered = make(chan int, 10)
		release := make(chan struct{})
		up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
			<-release
			return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
		}
		g := newGateway(t, "webhook_idempotency {\n provider github\n secret "+secret+"\n}", withUpstream(up))
		done := make(chan answer, 1)
		go func() { done <- g.serve(githubDelivery(secret, body, "d-1")) }()
		<-up.entered
		a := g.serve(githubDelivery(secret, body, "d-2"))
		requireRefused(t, a, http.StatusConflict, "same body")
		require.NotEmpty(t, a.header.Get("Retry-After"))
		close(release)
		requireRelayed(t, <-done)
		require.Equal(t, 1, up.count())
		requireDuplicate(t, g.serve(githubDelivery(secret, body, "d-2")))
	})
}

// TestEdge_OnMissingIDForward: a verified delivery without a usable ID is
// refused 400 by default, or forwarded without dedupe (and counted) with
// on_missing_id forward. The signature is checked either way.
func TestEdge_OnMissingIDForward(t *testing.T) {
	t.Parallel()
	const secret = "whsec_edge_noid"
	noID := []byte(`{"object":"event","type":"ping"}`)
	objectID := []byte(`{"id":{"nested":true},"object":"event"}`)

	reject := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n}")
	requireRefused(t, reject.serve(reject.stripe(secret, noID, reject.clock.Unix())), http.StatusBadRequest, "json id: event id missing")
	requireRefused(t, reject.serve(reject.stripe(secret, objectID, reject.clock.Unix())), http.StatusBadRequest, "not a string or number")
	require.Equal(t, 0, reject.up.count())
	require.Empty(t, reject.rows())

	scope := uniqueScope("edge_noid")
	g := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n scope "+scope+"\n on_missing_id forward\n}")
	for _, b := range [][]byte{noID, noID, objectID} {
		requireRelayed(t, g.serve(g.stripe(secret, b, g.clock.Unix())))
	}
	require.Equal(t, 3, g.up.count())
	g.requireForwarded(1, noID, "application/json")
	require.Empty(t, g.rows(), "no dedupe, no row")
	require.Equal(t, 3.0, g.outcomes(outcomeForwardedNoID))
	require.Len(t, g.logged("no usable event id"), 3)
	// Still verified.
	requireRefused(t, g.serve(g.stripe("whsec_wrong", noID, g.clock.Unix())), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 3, g.up.count())
	// A delivery with an ID is deduplicated as usual.
	withID := []byte(`{"id":"evt_edge_noid","object":"event"}`)
	requireRelayed(t, g.serve(g.stripe(secret, withID, g.clock.Unix())))
	requireDuplicate(t, g.serve(g.stripe(secret, withID, g.clock.Unix())))
	require.Equal(t, 4, g.up.count())
}

// TestEdge_EventIDSources: form fields, JSON paths that must resolve to one
// scalar (big numbers by their decimal text, strings unescaped), composite
// keys, and ambiguous sources.
func TestEdge_EventIDSources(t *testing.T) {
	t.Parallel()
	const secret = "gen_edge_id"
	hmacRoute := func(t *testing.T, eventID string) *gateway {
		return newGateway(t, `webhook_idempotency {
			provider hmac
			secret gen_edge_id
			`+eventID+`
			dedupe_body off
			hmac {
				header X-Signature
			}
		}`)
	}
	deliver := func(g *gateway, contentType string, body []byte, headers ...string) answer {
		h := append([]string{"Content-Type", contentType, "X-Signature", hexOf(mac256([]byte(secret), body))}, headers...)
		return g.serve(newDelivery("http://gateway.test/hook", body, h...))
	}

	t.Run("form", func(t *testing.T) {
		t.Parallel()
		g := hmacRoute(t, "event_id form trigger_id")
		const form = "application/x-www-form-urlencoded"
		requireRelayed(t, deliver(g, form, []byte("a=1&trigger_id=T%2F1+x&b=2")))
		g.requireRow("hmac", "T/1 x", store.StateCompleted)
		requireDuplicate(t, deliver(g, form, []byte("trigger_id=T%2F1+x")))
		requireRefused(t, deliver(g, form, []byte("a=1")), http.StatusBadRequest, "form trigger_id: event id missing")
		requireRefused(t, deliver(g, form, []byte("trigger_id=1&trigger_id=2")), http.StatusBadRequest, "more than once")
		requireRefused(t, deliver(g, form, []byte("trigger_id=")), http.StatusBadRequest, "event id empty")
		requireRefused(t, deliver(g, form, []byte("trigger_id=%zz")), http.StatusBadRequest, "not form-encoded")
		require.Equal(t, 1, g.up.count())
	})

	t.Run("json", func(t *testing.T) {
		t.Parallel()
		g := hmacRoute(t, "event_id json data.id")
		for body, want := range map[string]string{
			`{"data":{"id":18446744073709551617}}`:  "18446744073709551617",
			`{"data":{"id":1.50}}`:                  "1.50",
			`{"data":{"id":"evt_\u00e9\"q\\\\"}}`:   `evt_é"q\\`,
			`{"data":{"id":"evt_plain"},"x":[1,2]}`: "evt_plain",
		} {
			requireRelayed(t, deliver(g, "application/json", []byte(body)))
			g.requireRow("hmac", want, store.StateCompleted)
		}
		require.Equal(t, 4, g.up.count())
		// 18446744073709551617 and ...616 are different events.
		requireRelayed(t, deliver(g, "application/json", []byte(`{"data":{"id":18446744073709551616}}`)))
		for body, reason := range map[string]string{
			`{"data":{"id":{"a":1}}}`: "not a string or number",
			`{"data":{"id":[1]}}`:     "not a string or number",
			`{"data":{"id":null}}`:    "not a string or number",
			`{"data":{"id":true}}`:    "not a string or number",
			`{"data":{"id":""}}`:      "event id empty",
			`{"data":{}}`:             "event id missing",
			`{"data":{"id":"a"`:       "not JSON",
			`[{"data":{"id":"a"}}]`:   "event id missing",
			`{"data":{"id":"` + strings.Repeat("x", 256) + `"}}`: "longer than 255 bytes",
		} {
			requireRefused(t, deliver(g, "application/json", []byte(body)), http.StatusBadRequest, reason)
		}
		require.Equal(t, 5, g.up.count())
		// A path that can select several values is refused when configured.
		_, err := adaptJSON("http://localhost:9999 {\n webhook_idempotency {\n provider hmac\n secret s\n event_id json items.#.id\n }\n}\n")
		require.ErrorContains(t, err, "selects by pattern, query or modifier")
	})

	t.Run("composite and headers", func(t *testing.T) {
		t.Parallel()
		g := hmacRoute(t, "event_id json event event_ts\n event_id header X-Tenant")
		requireRelayed(t, deliver(g, "application/json", []byte(`{"event":"a.b","event_ts":1700000000000}`), "X-Tenant", "t1"))
		g.requireRow("hmac", `["a.b","1700000000000","t1"]`, store.StateCompleted)
		// Another split of the same characters is another key.
		requireRelayed(t, deliver(g, "application/json", []byte(`{"event":"a","event_ts":".b1700000000000"}`), "X-Tenant", "t1"))
		require.Equal(t, 2, g.up.count())
		requireRefused(t, deliver(g, "application/json", []byte(`{"event":"a.b","event_ts":1}`), "X-Tenant", "t1", "X-Tenant", "t2"),
			http.StatusBadRequest, "more than once")
		requireRefused(t, deliver(g, "application/json", []byte(`{"event":"a.b","event_ts":1}`)),
			http.StatusBadRequest, "header X-Tenant: event id missing")
		// Header names are case-insensitive, also in a hand-built map.
		req := newDelivery("http://gateway.test/hook", []byte(`{"event":"c","event_ts":2}`),
			"Content-Type", "application/json", "X-Signature", hexOf(mac256([]byte(secret), []byte(`{"event":"c","event_ts":2}`))))
		req.Header["x-tenant"] = []string{"t3"}
		requireRelayed(t, g.serve(req))
		g.requireRow("hmac", `["c","2","t3"]`, store.StateCompleted)
	})
}

// TestEdge_HandshakePassthrough: with handshake forward, challenges are verified, forwarded every
// time without a claim, and the upstream's answer reaches the caller as it
// was; a challenge with a bad signature never reaches the upstream.
func TestEdge_HandshakePassthrough(t *testing.T) {
	t.Parallel()
	const secret = "slack_edge_hs"
	up := newUpstream()
	up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
		status := http.StatusCreated
		if n == 2 {
			status = http.StatusInternalServerError
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Upstream-Call", strconv.Itoa(n))
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "challenge-"+strconv.Itoa(n))
		return nil
	}
	g := newGateway(t, "webhook_idempotency {\n provider slack\n secret "+secret+"\n handshake forward\n}", withUpstream(up))
	hs := []byte(`{"token":"t","challenge":"edge","type":"url_verification"}`)
	send := func(b []byte, sigSecret string) answer {
		return g.serve(newDelivery("http://gateway.test/slack", b,
			append([]string{"Content-Type", "application/json"}, slackHeaders(sigSecret, b, g.clock.Unix())...)...))
	}
	for n := 1; n <= 3; n++ {
		a := send(hs, secret)
		want := http.StatusCreated
		if n == 2 {
			want = http.StatusInternalServerError
		}
		require.Equal(t, want, a.status)
		require.Equal(t, "text/plain; charset=utf-8", a.header.Get("Content-Type"))
		require.Equal(t, strconv.Itoa(n), a.header.Get("X-Upstream-Call"))
		require.Equal(t, "challenge-"+strconv.Itoa(n), string(a.body))
		require.Empty(t, a.header.Get("Idempotent-Replayed"))
		g.requireForwarded(n-1, hs, "application/json")
	}
	require.Empty(t, g.rows())
	requireRefused(t, send(hs, "slack_wrong"), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 3, up.count())
	// Only the handshake type is exempt: an event with an event_id is
	// deduplicated.
	ev := []byte(`{"type":"event_callback","event_id":"Ev0EDGEHS","challenge":"edge"}`)
	send(ev, secret)
	requireDuplicate(t, send(ev, secret))
	require.Equal(t, 4, up.count())
}

// TestEdge_GzipBodies: verified over the decoded bytes, max_body on the
// decoded size, the upstream gets the gzip bytes as they came; other
// encodings 415.
func TestEdge_GzipBodies(t *testing.T) {
	t.Parallel()
	const secret = "whsec_edge_gzip"
	g := newGateway(t, "webhook_idempotency {\n provider stripe\n secret "+secret+"\n max_body 1KB\n}")
	require.EqualValues(t, 1000, g.h.MaxBody)
	// A Stripe event of exactly n bytes.
	event := func(id string, n int) []byte {
		head := `{"id":"` + id + `","object":"event","pad":"`
		b := []byte(head + strings.Repeat("x", n-len(head)-2) + `"}`)
		require.Len(t, b, n)
		return b
	}
	deliver := func(body []byte, signed []byte, encodings ...string) answer {
		h := []string{"Content-Type", "application/json", "Stripe-Signature", stripeHeader(secret, signed, g.clock.Unix())}
		for _, e := range encodings {
			h = append(h, "Content-Encoding", e)
		}
		return g.serve(newDelivery("http://gateway.test/webhooks/stripe", body, h...))
	}

	// Decoded, verified, forwarded as it came.
	u := event("evt_gz_1", 1000)
	gz := gzipped(t, u)
	require.Less(t, len(gz), 200)
	requireRelayed(t, deliver(gz, u, "gzip"))
	c := g.requireForwarded(0, gz, "application/json")
	require.Equal(t, []string{"gzip"}, c.Header.Values("Content-Encoding"))
	g.requireRow("stripe", "evt_gz_1", store.StateCompleted)
	// Encoding names are case-insensitive; identity is no encoding.
	u2 := event("evt_gz_2", 500)
	requireRelayed(t, deliver(gzipped(t, u2), u2, "GZip"))
	u3 := event("evt_gz_3", 500)
	requireRelayed(t, deliver(u3, u3, "identity"))
	require.Equal(t, 3, g.up.count())

	// max_body applies to the decoded size: 1001 decoded bytes from a
	// body of under 200.
	big := event("evt_gz_big", 1001)
	requireRefused(t, deliver(gzipped(t, big), big, "gzip"), http.StatusRequestEntityTooLarge, "max_body")
	requireRefused(t, deliver(big, big), http.StatusRequestEntityTooLarge, "max_body")
	g.requireNoRow("stripe", "evt_gz_big")

	// Malformed or truncated gzip: 400.
	u4 := event("evt_gz_4", 500)
	requireRefused(t, deliver([]byte("not gzip at all"), u4, "gzip"), http.StatusBadRequest, "gzip body is malformed")
	gz4 := gzipped(t, u4)
	requireRefused(t, deliver(gz4[:len(gz4)-6], u4, "gzip"), http.StatusBadRequest, "gzip body is malformed")

	// Other encodings, stacked encodings, or the header on two lines: 415.
	for _, enc := range [][]string{{"br"}, {"deflate"}, {"zstd"}, {"compress"}, {"x-gzip"}, {"gzip, br"}, {"gzip, gzip"},
		{"gzip", "br"}, {"identity", "gzip"}, {"gzip", "gzip"}} {
		body := u4
		if enc[0] == "gzip" || enc[0] == "identity" && len(enc) > 1 {
			body = gz4
		}
		requireRefused(t, deliver(body, u4, enc...), http.StatusUnsupportedMediaType, "Content-Encoding")
	}
	require.Equal(t, 3, g.up.count())
	g.requireNoRow("stripe", "evt_gz_4")
}

// TestEdge_HeaderQuirks: names are case-insensitive; a signature (or signed
// timestamp) header on several lines is refused; svix-* aliases; GitHub's
// SHA-1 only with allow_sha1 and never over a bad SHA-256.
func TestEdge_HeaderQuirks(t *testing.T) {
	t.Parallel()

	t.Run("repeated lines refused", func(t *testing.T) {
		t.Parallel()
		body := []byte(`{"zen":"edge","hook_id":1}`)
		gh := newGateway(t, "webhook_idempotency {\n provider github\n secret gh_edge\n}")
		sig := "sha256=" + hexOf(mac256([]byte("gh_edge"), body))
		// Even two identical valid lines: a proxy that merges or picks one
		// must not decide what is verified.
		for _, second := range []string{sig, "sha256=" + strings.Repeat("0", 64)} {
			a := gh.serve(newDelivery("http://gateway.test/gh", body, "Content-Type", "application/json",
				"X-GitHub-Delivery", "q-1", "X-Hub-Signature-256", sig, "X-Hub-Signature-256", second))
			requireRefused(t, a, http.StatusBadRequest, "malformed signature header")
		}
		require.Equal(t, 0, gh.up.count())
		require.Empty(t, gh.rows())

		sl := newGateway(t, "webhook_idempotency {\n provider slack\n secret slack_edge\n}")
		ev := []byte(`{"type":"event_callback","event_id":"Ev0EDGE1"}`)
		hs := slackHeaders("slack_edge", ev, sl.clock.Unix())
		for _, extra := range [][]string{
			{hs[2], hs[3]}, // X-Slack-Signature twice
			{hs[0], hs[1]}, // X-Slack-Request-Timestamp twice
		} {
			a := sl.serve(newDelivery("http://gateway.test/slack", ev,
				append(append([]string{"Content-Type", "application/json"}, hs...), extra...)...))
			requireRefused(t, a, http.StatusBadRequest, "malformed signature header")
		}
		require.Empty(t, sl.rows())

		st := newGateway(t, "webhook_idempotency {\n provider stripe\n secret whsec_edge\n}")
		sb := []byte(`{"id":"evt_edge_2t","object":"event"}`)
		now := strconv.FormatInt(st.clock.Unix(), 10)
		a := st.serve(newDelivery("http://gateway.test/stripe", sb, "Content-Type", "application/json",
			"Stripe-Signature", "t="+now+",t="+now+",v1="+stripeSig("whsec_edge", sb, now)))
		requireRefused(t, a, http.StatusBadRequest, "malformed signature header")
		st.requireNoRow("stripe", "evt_edge_2t")
	})

	t.Run("names case-insensitive", func(t *testing.T) {
		t.Parallel()
		body := []byte(`{"zen":"case","hook_id":2}`)
		g := newGateway(t, "webhook_idempotency {\n provider github\n secret gh_edge\n}")
		req := newDelivery("http://gateway.test/gh", body, "Content-Type", "application/json")
		req.Header["x-hub-signature-256"] = []string{"sha256=" + hexOf(mac256([]byte("gh_edge"), body))}
		req.Header["x-github-delivery"] = []string{"case-1"}
		requireRelayed(t, g.serve(req))
		g.requireRow("github", "case-1", store.StateCompleted)
	})

	t.Run("svix aliases", func(t *testing.T) {
		t.Parallel()
		secret := "whsec_" + b64Of([]byte("edge-svix-key-0123456789abcdef!!"))
		key := swKey(t, secret)
		body := []byte(`{"type":"edge"}`)
		for _, provider := range []string{"standard", "svix"} {
			g := newGateway(t, "webhook_idempotency {\n provider "+provider+"\n secret "+secret+"\n}")
			now := g.clock.Unix()
			for i, prefix := range []string{"webhook", "svix"} {
				id := fmt.Sprintf("msg_%s_%d", provider, i)
				a := g.serve(newDelivery("http://gateway.test/sw", body, "Content-Type", "application/json",
					prefix+"-id", id, prefix+"-timestamp", strconv.FormatInt(now, 10),
					prefix+"-signature", "v1,"+swSig(key, id, now, body)))
				requireRelayed(t, a)
				g.requireRow(provider, id, store.StateCompleted)
			}
			// The same message under the other family's names: a duplicate.
			id := fmt.Sprintf("msg_%s_0", provider)
			requireDuplicate(t, g.serve(newDelivery("http://gateway.test/sw", body, "Content-Type", "application/json",
				"svix-id", id, "svix-timestamp", strconv.FormatInt(now, 10), "svix-signature", "v1,"+swSig(key, id, now, body))))
			require.Equal(t, 2, g.up.count())
		}
	})

	t.Run("github sha1", func(t *testing.T) {
		t.Parallel()
		body := []byte(`{"zen":"sha1","hook_id":3}`)
		sha1Sig := "sha1=" + hexOf(mac1([]byte("gh_edge"), body))
		good256 := "sha256=" + hexOf(mac256([]byte("gh_edge"), body))
		deliver := func(g *gateway, id string, headers ...string) answer {
			return g.serve(newDelivery("http://gateway.test/gh", body,
				append([]string{"Content-Type", "application/json", "X-GitHub-Delivery", id}, headers...)...))
		}
		def := newGateway(t, "webhook_idempotency {\n provider github\n secret gh_edge\n}")
		requireRefused(t, deliver(def, "s-1", "X-Hub-Signature", sha1Sig), http.StatusBadRequest, "missing signature header")
		// The answer names only the reason; the log line tells the operator why.
		require.Contains(t, def.deliveryLog()[0]["reason"], "allow_sha1")
		allow := newGateway(t, "webhook_idempotency {\n provider github\n secret gh_edge\n allow_sha1\n}")
		for _, bad := range []string{"sha256=" + strings.Repeat("0", 64), "sha256=zz", "", "sha1=" + sha1Sig[5:]} {
			requireRefused(t, deliver(allow, "s-2", "X-Hub-Signature-256", bad, "X-Hub-Signature", sha1Sig),
				http.StatusBadRequest, "signature")
		}
		require.Empty(t, allow.rows())
		requireRelayed(t, deliver(allow, "s-3", "X-Hub-Signature", sha1Sig))
		// With both headers the SHA-256 one decides; s-4 is s-3's body
		// again, so dedupe_body answers it at the edge.
		requireDuplicate(t, deliver(allow, "s-4", "X-Hub-Signature-256", good256, "X-Hub-Signature", "sha1=bogus"))
		require.Equal(t, 1, allow.up.count())

		// allow_sha1 is for github only.
		require.ErrorContains(t, provisionErr(t, "webhook_idempotency {\n provider stripe\n secret x\n allow_sha1\n}"), "allow_sha1")
	})
}

// TestEdge_URLSignedSchemesIgnoreHostAndForwardedHeaders: Square and Twilio
// are verified against the configured url only: the request's Host and
// X-Forwarded-* headers neither help a forged signature nor break a good
// one.
func TestEdge_URLSignedSchemesIgnoreHostAndForwardedHeaders(t *testing.T) {
	t.Parallel()
	const public = "https://hooks.example.test/square/webhook"
	body := []byte(`{"merchant_id":"M_EDGE","type":"payment.updated","event_id":"sq-edge-1"}`)
	sig := func(u string) string { return b64Of(mac256([]byte("sq_edge"), []byte(u), body)) }
	g := newGateway(t, "webhook_idempotency {\n provider square\n secret sq_edge\n url "+public+"\n}")
	hostile := []string{
		"X-Forwarded-Host", "evil.example", "X-Forwarded-Proto", "http", "X-Forwarded-Port", "8443",
		"Forwarded", "for=1.2.3.4;host=evil.example;proto=http",
	}
	deliver := func(target, signature string, headers ...string) answer {
		req := newDelivery(target, body, append([]string{"Content-Type", "application/json",
			"x-square-hmacsha256-signature", signature}, headers...)...)
		return g.serve(req)
	}
	for _, forged := range []string{
		"http://10.0.0.5:8080/square/webhook?x=1",       // the request's own URL
		"https://evil.example/square/webhook",           // X-Forwarded-Host / Forwarded host
		"http://hooks.example.test:8443/square/webhook", // X-Forwarded-Proto and -Port
		public + "/",    // a trailing slash
		public + "?x=1", // the request's query
	} {
		a := deliver("http://10.0.0.5:8080/square/webhook?x=1", sig(forged), hostile...)
		requireRefused(t, a, http.StatusBadRequest, "no matching signature")
	}
	require.Equal(t, 0, g.up.count())
	require.Empty(t, g.rows())
	// The genuine signature passes whatever Host and X-Forwarded-* say.
	req := newDelivery("http://evil.example:8080/elsewhere", body, append([]string{"Content-Type", "application/json",
		"x-square-hmacsha256-signature", sig(public)}, hostile...)...)
	req.Host = "evil.example"
	requireRelayed(t, g.serve(req))
	g.requireRow("square", "sq-edge-1", store.StateCompleted)

	// Twilio: same rule.
	const twURL = "https://hooks.example.test/twilio/voice"
	form := []byte("CallSid=CA_EDGE&From=%2B15550000009")
	twSig := func(u string) string {
		return b64Of(mac1([]byte("tw_edge"), []byte(u+"CallSidCA_EDGEFrom+15550000009")))
	}
	tw := newGateway(t, "webhook_idempotency {\n provider twilio\n secret tw_edge\n url "+twURL+"\n}")
	twDeliver := func(target, signature string) answer {
		return tw.serve(newDelivery(target, form, append([]string{"Content-Type", "application/x-www-form-urlencoded",
			"I-Twilio-Idempotency-Token", "idem-edge", "X-Twilio-Signature", signature}, hostile...)...))
	}
	requireRefused(t, twDeliver("http://10.0.0.5:8080/twilio/voice", twSig("http://10.0.0.5:8080/twilio/voice")),
		http.StatusBadRequest, "no matching signature")
	requireRefused(t, twDeliver("http://10.0.0.5:8080/twilio/voice", twSig("https://evil.example/twilio/voice")),
		http.StatusBadRequest, "no matching signature")
	require.Equal(t, 0, tw.up.count())
	requireRelayed(t, twDeliver("http://10.0.0.5:8080/twilio/voice", twSig(twURL)))
	tw.requireForwarded(0, form, "application/x-www-form-urlencoded")
}
