package caddymodule

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// cliSigningSecret is a well-formed signing secret for provider: whsec_<base64>
// for every Standard Webhooks/Svix preset, Discord's private seed (hex),
// Telnyx's seed:<base64>, SendGrid's PKCS#8 ECDSA key (base64), else plain text.
func cliSigningSecret(t *testing.T, provider string) string {
	t.Helper()
	b := make([]byte, 32)
	_, err := rand.Read(b)
	require.NoError(t, err)
	if s, ok := fetchedSigningSecret(t, provider); ok {
		return s
	}
	if p, ok := signature.Lookup(provider); ok && p.Secret == "whsec" { // standard, svix and the presets built on them
		return "whsec_" + base64.StdEncoding.EncodeToString(b)
	}
	switch provider {
	case "discord", "adyen":
		return hex.EncodeToString(b)
	case "chargebee":
		return "cb_user:" + hex.EncodeToString(b)
	case "rapyd":
		return "rak_" + hex.EncodeToString(b[:8]) + ":rsk_" + hex.EncodeToString(b[8:])
	case "braintree":
		return "bt_public_" + hex.EncodeToString(b[:4]) + ":" + hex.EncodeToString(b[4:])
	case "telnyx":
		return "seed:" + base64.StdEncoding.EncodeToString(b)
	case "postmark": // HTTP Basic credentials
		return "hook:" + hex.EncodeToString(b)
	case "sendgrid":
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		der, err := x509.MarshalPKCS8PrivateKey(k)
		require.NoError(t, err)
		return base64.StdEncoding.EncodeToString(der)
	}
	return "cli_" + hex.EncodeToString(b)
}

// TestSignAcceptedByEveryProvider signs a delivery with the CLI's signing
// code for every preset and serves it through a real Handler configured for
// that provider (SQLite store): the first delivery reaches the upstream,
// the same event signed again is a duplicate.
func TestSignAcceptedByEveryProvider(t *testing.T) {
	t.Parallel()
	for _, provider := range signature.Providers() {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			preset, ok := signature.Lookup(provider)
			require.True(t, ok)
			signing := cliSigningSecret(t, provider)
			verifying, err := signature.PublicSecret(provider, signing)
			require.NoError(t, err)

			h := &Handler{
				Provider: provider,
				Secrets:  []string{verifying},
				Storage:  &Storage{Backend: "sqlite", Path: filepath.Join(t.TempDir(), "events.db")},
			}
			p := cli.SignParams{Provider: provider, Secret: signing}
			if preset.NeedsURL {
				h.URL = "https://hooks.example.test/" + provider + "?tenant=a"
				p.URL = h.URL
			}
			if provider == "hmac" {
				h.HMAC = &HMACConfig{Header: "X-Webhook-Signature", Algorithm: "sha512", Encoding: "base64", Prefix: "sha512="}
				p.HMAC = signature.HMACOptions{Header: "X-Webhook-Signature", Algorithm: "sha512", Encoding: "base64", Prefix: "sha512="}
			}
			if len(preset.EventID) == 0 {
				h.EventID = []eventid.Source{{Kind: eventid.JSON, Name: "id"}}
				p.EventIDFrom = "json id"
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
			err = h.Provision(ctx)
			t.Cleanup(func() {
				cancel()
				_ = h.Cleanup()
			})
			require.NoError(t, err)
			require.NoError(t, h.Validate())

			var calls atomic.Int32
			var forwarded []byte
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				calls.Add(1)
				forwarded, _ = io.ReadAll(r.Body)
				w.WriteHeader(http.StatusAccepted)
				_, _ = io.WriteString(w, `{"upstream":true}`)
				return nil
			})
			serve := func(d cli.Delivery) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodPost, "http://gateway.test/hook", bytes.NewReader(d.Body))
				for k, vs := range d.Header {
					req.Header[k] = vs
				}
				req = req.WithContext(context.WithValue(req.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
				rec := httptest.NewRecorder()
				require.NoError(t, h.ServeHTTP(rec, req, next))
				return rec
			}

			d, err := cli.BuildDelivery(p)
			require.NoError(t, err)
			require.NotEmpty(t, d.EventID)
			rec := serve(d)
			require.Equal(t, http.StatusAccepted, rec.Code, "refused: %s", rec.Body)
			require.Empty(t, rec.Header().Get("Idempotent-Replayed"))
			require.EqualValues(t, 1, calls.Load())
			require.Equal(t, d.Body, forwarded)

			// The same event, signed again (a provider's retry).
			p.EventID = d.EventID
			p.Now = time.Now().Add(time.Second)
			again, err := cli.BuildDelivery(p)
			if len(preset.EventID) > 0 && strings.HasPrefix(preset.EventID[0], "form_sha256 ") {
				// The ID is the hash of the signed payload: the retry is
				// the same delivery (braintree).
				again, err = d, nil
			}
			require.NoError(t, err)
			require.Equal(t, d.EventID, again.EventID)
			rec = serve(again)
			want := http.StatusOK // the short duplicate answer
			if preset.ReplayResponse {
				want = http.StatusAccepted // the upstream's own answer, replayed
			}
			require.Equal(t, want, rec.Code, rec.Body.String())
			require.Equal(t, "true", rec.Header().Get("Idempotent-Replayed"))
			require.EqualValues(t, 1, calls.Load())
		})
	}
}

// runCLI runs "caddy webhook-idempotency <args>" in process and returns its
// standard output.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "webhook-idempotency", SilenceErrors: true, SilenceUsage: true}
	cli.Configure(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// TestCommandEndToEnd runs the sign and event subcommands against the
// in-process Caddy: deliveries signed by the CLI are forwarded once, and the
// event commands see and change them through the admin API.
func TestCommandEndToEnd(t *testing.T) {
	secret := "whsec_" + randomHex(16)
	g := startOpsGateway(t, opsConfig{secrets: []string{secret}})
	id := "evt_cli_" + randomHex(6)
	sign := func(extra ...string) (string, error) {
		args := append([]string{"sign", "--provider", "stripe", "--secret", secret, "--to", g.url,
			"--event-id", id, "--header", "X-Test-Event: " + id}, extra...)
		return runCLI(t, args...)
	}
	event := func(action string, extra ...string) (string, error) {
		return runCLI(t, append([]string{"event", action, "--admin", "localhost:2999", "--scope", g.scope, "--id", id}, extra...)...)
	}

	out, err := sign()
	require.NoError(t, err, out)
	require.Contains(t, out, "status: 200\n")
	require.Contains(t, out, "Idempotent-Replayed: false\n")
	require.Contains(t, out, `{"upstream":true}`)
	require.Contains(t, out, "event_id="+id)
	require.NotContains(t, out, secret)
	require.Equal(t, 1, g.up.count(id))

	out, err = sign()
	require.NoError(t, err, out)
	require.Contains(t, out, "status: 200\n")
	require.Contains(t, out, "Idempotent-Replayed: true\n")
	require.Contains(t, out, `"duplicate":true`)
	require.Equal(t, 1, g.up.count(id))

	var ev EventJSON
	// The completion is written just after the answer.
	for deadline := time.Now().Add(5 * time.Second); ev.State != "completed" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		out, err = event("get")
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal([]byte(out), &ev), out)
	}
	require.Equal(t, "completed", ev.State)
	require.Equal(t, 1, ev.Attempts)
	require.Equal(t, 200, ev.Status)

	out, err = runCLI(t, "event", "list", "--admin", "localhost:2999", "--scope", g.scope, "--state", "completed")
	require.NoError(t, err)
	require.Contains(t, out, `"event_id": "`+id+`"`)

	_, err = event("release")
	require.ErrorContains(t, err, "HTTP 409", "a completed event is not released")

	out, err = event("forget")
	require.NoError(t, err)
	require.Contains(t, out, `"forgotten": true`)
	_, err = event("get")
	require.ErrorContains(t, err, "HTTP 404")

	out, err = sign()
	require.NoError(t, err, out)
	require.Contains(t, out, "Idempotent-Replayed: false\n")
	require.Equal(t, 2, g.up.count(id), "forgotten: forwarded again")

	// A refused delivery: the answer is printed and the command fails.
	out, err = runCLI(t, "sign", "--provider", "stripe", "--secret", "whsec_wrong", "--to", g.url)
	require.Error(t, err)
	require.Contains(t, out, "status: 400\n")
	require.Contains(t, out, "no matching signature")
}

// TestCommandEventOddIDs: every event subcommand addresses exactly the
// event named, whatever its ID: "." and ".." (which the admin server's path
// cleaning turned into the list of every event, exit 0), IDs with "/",
// "//", "%" or an escaped dot. A sentinel event survives every forget.
func TestCommandEventOddIDs(t *testing.T) {
	secret := "whsec_" + randomHex(16)
	g := startOpsGateway(t, opsConfig{secrets: []string{secret}})
	deliver := func(id string) {
		t.Helper()
		out, err := runCLI(t, "sign", "--provider", "stripe", "--secret", secret, "--to", g.url, "--event-id", id)
		require.NoError(t, err, out)
		require.Contains(t, out, "status: 200\n")
	}
	event := func(action, id string) (string, error) {
		return runCLI(t, "event", action, "--admin", "localhost:2999", "--scope", g.scope, "--id", id)
	}
	sentinel := "evt_sentinel_" + randomHex(4)
	deliver(sentinel)
	for _, id := range []string{".", "..", "a/b", "a/../b", "a//b", "100%", "%2e%2e", "./x"} {
		t.Run(id, func(t *testing.T) {
			deliver(id)
			var ev EventJSON
			// The completion is written just after the answer.
			for deadline := time.Now().Add(5 * time.Second); ev.State != "completed" && time.Now().Before(deadline); {
				out, err := event("get", id)
				require.NoError(t, err, out)
				require.NoError(t, json.Unmarshal([]byte(out), &ev), out)
				require.Equal(t, id, ev.EventID)
				if ev.State != "completed" {
					time.Sleep(20 * time.Millisecond)
				}
			}
			require.Equal(t, "completed", ev.State)

			_, err := event("release", id)
			require.ErrorContains(t, err, "HTTP 409", "the completed event itself, not another resource")
			out, err := event("complete", id)
			require.NoError(t, err, out)
			require.Contains(t, out, `"event_id": "`+id+`"`)

			out, err = event("forget", id)
			require.NoError(t, err, out)
			require.Contains(t, out, `"forgotten": true`)
			_, err = event("get", id)
			require.ErrorContains(t, err, "HTTP 404")
			out, err = event("get", sentinel)
			require.NoError(t, err, out)
			require.Contains(t, out, `"event_id": "`+sentinel+`"`)
		})
	}
}
