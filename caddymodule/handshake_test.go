package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// Handshakes, learned secrets and batches on a provisioned handler (the
// real SQLite store); protocol_integration_test.go runs them through Caddy.

func TestProtocolConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, snippet, want string
	}{
		{"handshake value", "provider slack\n secret s\n handshake maybe", `handshake: want edge or forward, got "maybe"`},
		{"handshake no value", "provider slack\n secret s\n handshake", "wrong argument count"},
		{"handshake twice", "provider slack\n secret s\n handshake edge\n handshake forward", "handshake already specified"},
		{"batch value", "provider sendgrid\n secret s\n batch each", `batch: want set or split, got "each"`},
		{"learned_secret value", "provider asana\n event_id json id\n learned_secret always", `learned_secret: want keep or replace, got "always"`},
		{"verify_token without handshake token", "provider stripe\n secret s\n verify_token t", "verify_token: provider stripe has no handshake with a verify token"},
		{"batch on a provider that does not batch", "provider stripe\n secret s\n batch split", "batch: provider stripe sends one event per delivery"},
		{"batch with event_id", "provider sendgrid\n secret MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEvAx7xa0OLwU1Q2WttEgrJV5GccH4scnhiJ4VosX845E1ASs0l3-U0GchE1eU4WFljd4eKrYrhWlfRSZ45Q0F6o0\n event_id json 0.sg_event_id\n batch set", "cannot be combined with event_id"},
		{"learned_secret on a provider that learns none", "provider stripe\n secret s\n learned_secret replace", "learned_secret: provider stripe learns no secret"},
		{"a secret is required unless learned", "provider stripe", "secret: at least one secret is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := provisionErr(t, "webhook_idempotency {\n "+tc.snippet+"\n}")
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	// Asana and Notion need no secret of their own: they learn it.
	for _, snippet := range []string{"provider asana\n event_id json id", "provider notion"} {
		h := new(Handler)
		require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\n "+snippet+"\n}")))
		require.NoError(t, provisionErr(t, "webhook_idempotency {\n "+snippet+"\n}"))
	}
}

// asanaHandshake is Asana's first POST of a new webhook.
func asanaHandshake(secret string) *http.Request {
	return newDelivery("http://gateway.test/asana", nil, "X-Hook-Secret", secret)
}

// asanaDelivery is an Asana event signed with secret.
func asanaDelivery(t *testing.T, secret, id string) *http.Request {
	t.Helper()
	d, err := cli.BuildDelivery(cli.SignParams{Provider: "asana", Secret: secret, EventIDFrom: "json id", EventID: id})
	require.NoError(t, err)
	req := newDelivery("http://gateway.test/asana", d.Body)
	req.Header = d.Header
	return req
}

func TestLearnedSecretReplace(t *testing.T) {
	t.Parallel()
	scope := uniqueScope("asana")
	g := newGateway(t, "webhook_idempotency {\n provider asana\n event_id json id\n learned_secret replace\n scope "+scope+"\n}")
	a := g.serve(asanaHandshake("first-secret"))
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, "first-secret", a.header.Get("X-Hook-Secret"))
	requireRelayed(t, g.serve(asanaDelivery(t, "first-secret", "e1")))

	// The webhook is registered again, within a window the operator
	// opened (learning the first closed the first load's): the new secret
	// replaces the old.
	requireRefused(t, g.serve(asanaHandshake("second-secret")), http.StatusBadRequest, "no enrollment window is open")
	require.NoError(t, g.h.backend.secrets.Enroll(context.Background(), scope, g.clock.Now().Add(time.Minute)))
	a = g.serve(asanaHandshake("second-secret"))
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, "second-secret", a.header.Get("X-Hook-Secret"))
	requireRelayed(t, g.serve(asanaDelivery(t, "second-secret", "e2")))
	requireRefused(t, g.serve(asanaDelivery(t, "first-secret", "e3")), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 2, g.up.count())
	require.Equal(t, 2.0, g.outcomes(outcomeHandshake))

	// Neither secret reaches a log line.
	for _, e := range g.logs.All() {
		text := e.Message
		for _, f := range e.Context {
			text += " " + f.String
		}
		require.NotContains(t, text, "first-secret")
		require.NotContains(t, text, "second-secret")
	}
	require.Len(t, g.logged("learned the route's signing secret from the provider's handshake"), 2)
}

func TestLearnedSecretKeepRefusesReplacement(t *testing.T) {
	t.Parallel()
	g := newGateway(t, "webhook_idempotency {\n provider notion\n scope "+uniqueScope("notion")+"\n}")
	hs := func(token string) answer {
		return g.serve(newDelivery("http://gateway.test/notion", []byte(`{"verification_token":"`+token+`"}`), "Content-Type", "application/json"))
	}
	require.Equal(t, http.StatusOK, hs("secret_first").status)
	// The same token again (a repeated handshake) is accepted.
	require.Equal(t, http.StatusOK, hs("secret_first").status)
	requireRefused(t, hs("secret_forged"), http.StatusBadRequest, "no enrollment window is open")
	// Within a window, keep still refuses a different secret.
	require.NoError(t, g.h.backend.secrets.Enroll(context.Background(), g.h.Scope, g.clock.Now().Add(time.Minute)))
	requireRefused(t, hs("secret_forged"), http.StatusBadRequest, "a different secret was learned before")
	require.Zero(t, g.up.count())
	// Deliveries verify with the first token only.
	sign := func(token, id string) *http.Request {
		d, err := cli.BuildDelivery(cli.SignParams{Provider: "notion", Secret: token, EventID: id})
		require.NoError(t, err)
		req := newDelivery("http://gateway.test/notion", d.Body)
		req.Header = d.Header
		return req
	}
	requireRelayed(t, g.serve(sign("secret_first", "n1")))
	requireRefused(t, g.serve(sign("secret_forged", "n2")), http.StatusBadRequest, "no matching signature")
	require.Equal(t, 3.0, g.outcomes(outcomeInvalidSignature), "the forged handshakes and the forged delivery")
}

func TestHandshakeForwardLearnsOnUpstream2xx(t *testing.T) {
	t.Parallel()
	up := newUpstream()
	up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
		switch {
		case r.Header.Get("X-Hook-Secret") == "":
			return answerWith(http.StatusOK, "text/plain", "ok")(w, r, n)
		case n == 1:
			w.WriteHeader(http.StatusServiceUnavailable) // the application is not ready
			return nil
		}
		w.Header().Set("X-Hook-Secret", r.Header.Get("X-Hook-Secret"))
		w.WriteHeader(http.StatusOK)
		return nil
	}
	g := newGateway(t, "webhook_idempotency {\n provider asana\n event_id json id\n handshake forward\n scope "+uniqueScope("asana")+"\n}", withUpstream(up))
	a := g.serve(asanaHandshake("fw-secret"))
	require.Equal(t, http.StatusServiceUnavailable, a.status)
	requireRefused(t, g.serve(asanaDelivery(t, "fw-secret", "f0")), http.StatusBadRequest, "no matching signature")
	a = g.serve(asanaHandshake("fw-secret"))
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, "fw-secret", a.header.Get("X-Hook-Secret"), "the upstream's answer")
	require.Equal(t, 2, up.count(), "both handshakes reached the upstream, unclaimed")
	requireRelayed(t, g.serve(asanaDelivery(t, "fw-secret", "f1")))
	require.Len(t, g.rows(), 2, "the event and its body hash (dedupe_body); no handshake row")
}

func TestVerifyTokenMissingRefusesHandshakeOnly(t *testing.T) {
	t.Parallel()
	g := newGateway(t, "webhook_idempotency {\n provider meta\n secret meta_app\n event_id json id\n}")
	req := newDelivery("http://gateway.test/meta?hub.mode=subscribe&hub.challenge=42&hub.verify_token=anything", nil)
	req.Method = http.MethodGet
	a := g.serve(req)
	requireRefused(t, a, http.StatusBadRequest, "verify token does not match")
	// A meta route with handshake forward passes it on, token unchecked.
	f := newGateway(t, "webhook_idempotency {\n provider meta\n secret meta_app\n event_id json id\n handshake forward\n}")
	req = newDelivery("http://gateway.test/meta?hub.mode=subscribe&hub.challenge=42&hub.verify_token=anything", nil)
	req.Method = http.MethodGet
	a = f.serve(req)
	require.Equal(t, http.StatusOK, a.status)
	require.Equal(t, 1, f.up.count())
	require.Contains(t, f.up.call(t, 0).URL, "hub.challenge=42")
	require.Empty(t, f.rows())
}

// gocardlessBatch is a GoCardless delivery of events ids, signed.
func gocardlessBatch(t *testing.T, secret string, ids ...string) *http.Request {
	t.Helper()
	items := make([]string, len(ids))
	for i, id := range ids {
		items[i] = `{"id":"` + id + `","action":"confirmed"}`
	}
	d, err := cli.BuildDelivery(cli.SignParams{Provider: "gocardless", Secret: secret, Body: []byte(`{"events":[` + strings.Join(items, ",") + `]}`)})
	require.NoError(t, err)
	req := newDelivery("http://gateway.test/gc", d.Body)
	req.Header = d.Header
	return req
}

func TestBatchSplitItemInFlight(t *testing.T) {
	t.Parallel()
	scope := uniqueScope("gc")
	g := newGateway(t, "webhook_idempotency {\n provider gocardless\n secret gc_secret\n batch split\n scope "+scope+"\n}")
	// Another delivery holds EV2's claim.
	c, err := g.h.backend.Claim(t.Context(), store.ClaimParams{Scope: scope, EventID: "EV2", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Claimed, c.Outcome)

	a := g.serve(gocardlessBatch(t, "gc_secret", "EV1", "EV2", "EV3"))
	require.Equal(t, http.StatusConflict, a.status, "not 2xx: the provider must retry")
	require.NotEmpty(t, a.header.Get("Retry-After"))
	require.Contains(t, string(a.body), "1 of 3 items not completed")
	require.Equal(t, 2, g.up.count(), "EV1 and EV3 forwarded alone")
	g.requireRow(scope, "EV1", store.StateCompleted)
	g.requireRow(scope, "EV3", store.StateCompleted)

	require.NoError(t, g.h.backend.Release(t.Context(), scope, "EV2", c.Token))
	a = g.serve(gocardlessBatch(t, "gc_secret", "EV1", "EV2", "EV3"))
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.JSONEq(t, `{"received":true,"items":3,"forwarded":1,"duplicates":2}`, string(a.body))
	require.Equal(t, 3, g.up.count())
	require.Contains(t, string(g.up.call(t, 2).Body), `"EV2"`)
	require.NotContains(t, string(g.up.call(t, 2).Body), `"EV1"`)
	g.requireRow(scope, "EV2", store.StateCompleted)

	// A batch without items, or an item without an ID: 400, nothing claimed.
	for _, ids := range [][]string{{}, {""}} {
		requireRefused(t, g.serve(gocardlessBatch(t, "gc_secret", ids...)), http.StatusBadRequest, "batch")
	}
	require.Equal(t, 3, g.up.count())
}

func TestBatchSetOktaKeysOnItems(t *testing.T) {
	t.Parallel()
	g := newGateway(t, "webhook_idempotency {\n provider okta\n secret okta_secret\n scope "+uniqueScope("okta")+"\n}")
	send := func(eventID string, uuids ...string) answer {
		items := make([]string, len(uuids))
		for i, u := range uuids {
			items[i] = `{"uuid":"` + u + `","eventType":"user.session.start"}`
		}
		d, err := cli.BuildDelivery(cli.SignParams{Provider: "okta", Secret: "okta_secret",
			Body: []byte(`{"eventId":"` + eventID + `","data":{"events":[` + strings.Join(items, ",") + `]}}`)})
		require.NoError(t, err)
		req := newDelivery("http://gateway.test/okta", d.Body)
		req.Header = d.Header
		return g.serve(req)
	}
	requireRelayed(t, send("hook-1", "u1", "u2"))
	requireDuplicate(t, send("hook-1", "u2", "u1"))
	requireRelayed(t, send("hook-1", "u1", "u2", "u3"))
	require.Equal(t, 2, g.up.count())
}

// log-filter also removes what a handshake carries as a secret: Asana's
// X-Hook-Secret in the request and the answer, Meta's verify token in the
// uri; and Caddy accepts the result.
func TestLogFilterHandshakeSecrets(t *testing.T) {
	out, err := runCLI(t, "log-filter", "--provider", "asana,meta", "--site")
	require.NoError(t, err)
	require.Contains(t, out, "\t\t\trequest>headers>X-Hook-Secret delete\n")
	require.Contains(t, out, "\t\t\tresp_headers>X-Hook-Secret delete\n")
	require.Contains(t, out, "\t\t\trequest>uri query {\n\t\t\t\tdelete hub.verify_token\n\t\t\t}\n")
	site := ":8080 {\n" + out + "respond 200\n}\n"
	_, err = adaptJSON(site)
	require.NoError(t, err, site)
	global, err := runCLI(t, "log-filter", "--provider", "asana,meta")
	require.NoError(t, err)
	_, err = adaptJSON(global + ":8080 {\nrespond 200\n}\n")
	require.NoError(t, err, global)
}

// A signed body shaped like a handshake is one only when its
// discriminator is given once: with the member twice the upstream's parser
// may read the other value, so it is an event (claimed, forwarded once),
// never answered at the edge. A handshake that matched its shape but has
// nothing to answer with (Slack's url_verification without its challenge)
// is refused 400 at the edge, neither claimed nor forwarded; under
// handshake forward it is passed on unclaimed, as any handshake.
func TestHandshakeAmbiguousOrIncomplete(t *testing.T) {
	t.Parallel()
	pub, err := signature.PublicSecret("discord", discordSeed)
	require.NoError(t, err)
	slack := func(t *testing.T, body string) *http.Request { return signedFor(t, "slack", "slack_hs", body) }

	t.Run("discord type twice", func(t *testing.T) {
		t.Parallel()
		scope := uniqueScope("discord_hs")
		g := newGateway(t, "webhook_idempotency {\n provider discord\n secret "+pub+"\n scope "+scope+"\n}")
		for _, body := range []string{
			`{"type":1,"id":"int_1","type":2,"data":{"name":"pay"}}`,
			`{"type":1,"id":"int_2","TYPE":2,"data":{"name":"pay"}}`,
		} {
			requireRelayed(t, g.serve(discordDelivery(t, discordSeed, []byte(body), g.clock.Now())))
		}
		require.Equal(t, 2, g.up.count(), "forwarded as events")
		g.requireRow(scope, "int_1", store.StateCompleted)
		g.requireRow(scope, "int_2", store.StateCompleted)
		// A PING is still answered at the edge, unclaimed.
		a := g.serve(discordDelivery(t, discordSeed, []byte(`{"type":1,"id":"ping_1"}`), g.clock.Now()))
		require.Equal(t, http.StatusOK, a.status)
		require.JSONEq(t, `{"type":1}`, string(a.body))
		require.Equal(t, 2, g.up.count())
		require.Len(t, g.rows(), 2)
	})

	t.Run("slack type twice", func(t *testing.T) {
		t.Parallel()
		scope := uniqueScope("slack_hs")
		g := newGateway(t, "webhook_idempotency {\n provider slack\n secret slack_hs\n scope "+scope+"\n}")
		body := `{"type":"url_verification","challenge":"c1","type":"event_callback","event_id":"Ev1"}`
		requireRelayed(t, g.serve(slack(t, body)))
		requireDuplicate(t, g.serve(slack(t, body)))
		require.Equal(t, 1, g.up.count())
		g.requireRow(scope, "Ev1", store.StateCompleted)
	})

	t.Run("nothing to echo", func(t *testing.T) {
		t.Parallel()
		body := `{"type":"url_verification","token":"t","event_id":"Ev2"}`
		for _, b := range []string{body, `{"type":"url_verification","challenge":"","event_id":"Ev2"}`} {
			g := newGateway(t, "webhook_idempotency {\n provider slack\n secret slack_hs\n scope "+uniqueScope("slack_hs")+"\n}")
			requireRefused(t, g.serve(slack(t, b)), http.StatusBadRequest, "url_verification handshake without its json challenge")
			require.Zero(t, g.up.count())
			require.Empty(t, g.rows())
			require.Equal(t, 1.0, g.outcomes(outcomeBadRequest))
		}

		f := newGateway(t, "webhook_idempotency {\n provider slack\n secret slack_hs\n handshake forward\n scope "+uniqueScope("slack_hs")+"\n}")
		requireRelayed(t, f.serve(slack(t, body)))
		requireRelayed(t, f.serve(slack(t, body)))
		require.Equal(t, 2, f.up.count(), "a handshake: forwarded every time")
		require.Empty(t, f.rows(), "never claimed")
		require.Equal(t, 2.0, f.outcomes(outcomeHandshake))

		// Unsigned, it is refused as any delivery.
		g := newGateway(t, "webhook_idempotency {\n provider slack\n secret slack_hs\n scope "+uniqueScope("slack_hs")+"\n}")
		requireRefused(t, g.serve(newDelivery("http://gateway.test/slack", []byte(body))), http.StatusBadRequest, "missing signature header")
	})
}

// TestCase_BR19_HandshakesNotDeduplicated: with handshake forward, Zoom and
// Slack challenges are verified and forwarded every time, answered by the
// upstream unchanged, and never recorded (handshake_test.go: at the edge).
//
// Origin: field case BR-19 of the project's case list (formerly cases_test.go,
// where the field cases were grouped by report).
func TestCase_BR19_HandshakesNotDeduplicated(t *testing.T) {
	t.Parallel()
	t.Run("zoom", func(t *testing.T) {
		t.Parallel()
		const secret = "zm_BR19"
		up := newUpstream()
		up.respond = func(w http.ResponseWriter, r *http.Request, n int) error {
			var v struct {
				Payload struct {
					PlainToken string `json:"plainToken"`
				} `json:"payload"`
			}
			b := up.call(t, n-1).Body
			if err := json.Unmarshal(b, &v); err != nil {
				return err
			}
			out, _ := json.Marshal(map[string]string{
				"plainToken":     v.Payload.PlainToken,
				"encryptedToken": hexOf(mac256([]byte(secret), []byte(v.Payload.PlainToken))),
			})
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Upstream", "zoom-challenge")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(out)
			return nil
		}
		g := newGateway(t, `webhook_idempotency {
			provider zoom
			secret zm_BR19
			scope `+uniqueScope("br19")+`
			event_id json event event_ts
			handshake forward
		}`, withUpstream(up))
		zoom := func(body []byte) answer {
			ts := strconv.FormatInt(g.clock.Unix(), 10)
			return g.serve(newDelivery("http://gateway.test/zoom", body,
				"Content-Type", "application/json",
				"x-zm-request-timestamp", ts,
				"x-zm-signature", "v0="+hexOf(mac256([]byte(secret), []byte("v0:"+ts+":"), body))))
		}
		check := func(a answer, token string) {
			t.Helper()
			require.Equal(t, http.StatusOK, a.status)
			require.Empty(t, a.header.Get("Idempotent-Replayed"))
			require.Equal(t, "application/json", a.header.Get("Content-Type"))
			require.Equal(t, "zoom-challenge", a.header.Get("X-Upstream"))
			want, _ := json.Marshal(map[string]string{
				"plainToken": token, "encryptedToken": hexOf(mac256([]byte(secret), []byte(token))),
			})
			require.Equal(t, want, a.body, "the upstream's answer, unchanged")
		}
		tokenA := []byte(`{"event":"endpoint.url_validation","payload":{"plainToken":"BR19plainTokenA"},"event_ts":1700000000000}`)
		check(zoom(tokenA), "BR19plainTokenA")
		g.clock.Advance(72 * time.Hour)
		tokenB := []byte(`{"event":"endpoint.url_validation","payload":{"plainToken":"BR19plainTokenB"},"event_ts":1700259200000}`)
		check(zoom(tokenB), "BR19plainTokenB")
		g.clock.Advance(time.Minute)
		check(zoom(tokenA), "BR19plainTokenA")
		// A token the gateway would refuse if it computed the answer itself:
		// it does not, so it is the upstream's to judge.
		odd := `v0:1700000000:{"event":"x"}` + strings.Repeat("x", 130)
		oddBody, _ := json.Marshal(map[string]any{"event": "endpoint.url_validation", "payload": map[string]string{"plainToken": odd}, "event_ts": 1700259260000})
		check(zoom(oddBody), odd)
		require.Equal(t, 4, up.count())
		g.requireForwarded(0, tokenA, "application/json")
		g.requireForwarded(2, tokenA, "application/json")
		require.Empty(t, g.rows(), "challenges create no rows")
		require.Equal(t, 4.0, g.outcomes(outcomeHandshake))
		// An unsigned challenge never reaches the upstream: no signing oracle.
		a := g.serve(newDelivery("http://gateway.test/zoom", tokenA, "Content-Type", "application/json",
			"x-zm-request-timestamp", strconv.FormatInt(g.clock.Unix(), 10), "x-zm-signature", "v0="+strings.Repeat("0", 64)))
		requireRefused(t, a, http.StatusBadRequest, "no matching signature")
		require.Equal(t, 4, up.count())
	})

	t.Run("slack", func(t *testing.T) {
		t.Parallel()
		const secret = "slack_BR19"
		up := newUpstream()
		up.respond = answerWith(http.StatusOK, "application/json", `{"challenge":"BR19challenge"}`)
		g := newGateway(t, `webhook_idempotency {
			provider slack
			secret slack_BR19
			handshake forward
		}`, withUpstream(up))
		body := []byte(`{"token":"placeholder","challenge":"BR19challenge","type":"url_verification"}`)
		for i := range 2 {
			g.clock.Advance(time.Second)
			a := g.serve(newDelivery("http://gateway.test/slack/events", body,
				append([]string{"Content-Type", "application/json"}, slackHeaders(secret, body, g.clock.Unix())...)...))
			require.Equal(t, http.StatusOK, a.status)
			require.Empty(t, a.header.Get("Idempotent-Replayed"))
			require.Equal(t, "application/json", a.header.Get("Content-Type"))
			require.Equal(t, `{"challenge":"BR19challenge"}`, string(a.body))
			require.Equal(t, i+1, up.count())
			g.requireForwarded(i, body, "application/json")
		}
		require.Empty(t, g.rows())
	})
}
