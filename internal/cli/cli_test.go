package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/cli"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// TestBuildDelivery: the sign command's deliveries — the example payload
// with a fresh event ID or the one given, a body of one's own kept byte for
// byte, the ID in a header or a form field, and refusals that never echo a
// secret. (That every provider's handler accepts them is
// caddymodule's TestSignAcceptedByEveryProvider.)
func TestBuildDelivery(t *testing.T) {
	t.Parallel()
	t.Run("fresh id in the example payload, kept with --event-id", func(t *testing.T) {
		t.Parallel()
		a, err := cli.BuildDelivery(cli.SignParams{Provider: "stripe", Secret: "whsec_x"})
		require.NoError(t, err)
		b, err := cli.BuildDelivery(cli.SignParams{Provider: "stripe", Secret: "whsec_x"})
		require.NoError(t, err)
		require.NotEqual(t, a.EventID, b.EventID)
		var body struct{ ID, Object string }
		require.NoError(t, json.Unmarshal(a.Body, &body))
		require.Equal(t, a.EventID, body.ID)
		require.Equal(t, "event", body.Object, "the rest of the payload is kept")
		require.Equal(t, "application/json", a.Header.Get("Content-Type"))

		c, err := cli.BuildDelivery(cli.SignParams{Provider: "stripe", Secret: "whsec_x", EventID: "evt_fixed"})
		require.NoError(t, err)
		require.Equal(t, "evt_fixed", c.EventID)
		require.Contains(t, string(c.Body), `"evt_fixed"`)
	})
	t.Run("own body keeps its id", func(t *testing.T) {
		t.Parallel()
		body := []byte(`{"id":"evt_mine","object":"event"}`)
		d, err := cli.BuildDelivery(cli.SignParams{Provider: "stripe", Secret: "whsec_x", Body: body})
		require.NoError(t, err)
		require.Equal(t, "evt_mine", d.EventID)
		require.Equal(t, body, d.Body, "sent byte for byte")
	})
	t.Run("header id and extra headers", func(t *testing.T) {
		t.Parallel()
		d, err := cli.BuildDelivery(cli.SignParams{
			Provider: "github", Secret: "gh", EventID: "guid-1",
			Headers: http.Header{"X-Github-Event": {"push"}},
		})
		require.NoError(t, err)
		require.Equal(t, "guid-1", d.Header.Get("X-GitHub-Delivery"))
		require.Equal(t, "push", d.Header.Get("X-GitHub-Event"))
		require.True(t, strings.HasPrefix(d.Header.Get("X-Hub-Signature-256"), "sha256="))
	})
	t.Run("header id: the example body differs per event", func(t *testing.T) {
		// A github route's dedupe_body answers a known body under a new
		// delivery ID as a replay: two runs without --event-id must be
		// two events, two runs with one --event-id the same one.
		t.Parallel()
		p := cli.SignParams{Provider: "github", Secret: "gh", Headers: http.Header{"X-Github-Event": {"push"}}}
		a, err := cli.BuildDelivery(p)
		require.NoError(t, err)
		b, err := cli.BuildDelivery(p)
		require.NoError(t, err)
		require.NotEqual(t, a.EventID, b.EventID)
		require.NotEqual(t, a.Body, b.Body)
		require.Equal(t, a.EventID, gjson.GetBytes(a.Body, "test_delivery").String())
		require.True(t, gjson.GetBytes(a.Body, "repository").Exists(), "the rest of the example is kept")
		p.EventID = "guid-same"
		c, err := cli.BuildDelivery(p)
		require.NoError(t, err)
		d, err := cli.BuildDelivery(p)
		require.NoError(t, err)
		require.Equal(t, c.Body, d.Body)
	})
	t.Run("form body", func(t *testing.T) {
		t.Parallel()
		d, err := cli.BuildDelivery(cli.SignParams{
			Provider: "hmac", Secret: "s", HMAC: signature.HMACOptions{Header: "X-Sig"},
			Body: []byte("a=1&b=2"), ContentType: "application/x-www-form-urlencoded",
			EventID: "ev-9", EventIDFrom: "form event",
		})
		require.NoError(t, err)
		require.Equal(t, "a=1&b=2&event=ev-9", string(d.Body))
		require.NotEmpty(t, d.Header.Get("X-Sig"))
	})
	t.Run("refusals", func(t *testing.T) {
		t.Parallel()
		for name, p := range map[string]cli.SignParams{
			"unknown provider":     {Provider: "nope", Secret: "s"},
			"no secret":            {Provider: "stripe"},
			"id without a source":  {Provider: "hmac", Secret: "s", HMAC: signature.HMACOptions{Header: "X-Sig"}, EventID: "e"},
			"bad source":           {Provider: "stripe", Secret: "s", EventIDFrom: "cookie x", EventID: "e"},
			"json into a non-JSON": {Provider: "stripe", Secret: "s", Body: []byte("a=1"), EventID: "e"},
			"url-signed, no url":   {Provider: "square", Secret: "s"},
		} {
			_, err := cli.BuildDelivery(p)
			require.Error(t, err, name)
			require.NotContains(t, err.Error(), "whsec", name)
		}
	})
}

// A cut answer is reported with the status that arrived, so an operator can
// tell "the upstream answered 200, then the body was cut" from "no answer".
func TestSendSignedReportsStatusOfCutAnswer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", "10000")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, strings.Repeat("x", 100))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection is closed mid-body
	}))
	t.Cleanup(srv.Close)
	var out bytes.Buffer
	ok, err := cli.SendSigned(t.Context(), &out, cli.SignParams{Provider: "stripe", Secret: "whsec_cut"}, srv.URL, 5*time.Second)
	require.False(t, ok)
	require.ErrorContains(t, err, "status 200 received, body cut after 100 bytes")
	require.NotContains(t, err.Error(), "whsec_cut")
}

// --header "Host: ..." is the request's host, so a site matched by host
// (the README's hooks.example.com) can be tried locally (a new user's
// trial: net/http ignores a Host header and sent 127.0.0.1).
func TestSendSignedHostHeader(t *testing.T) {
	t.Parallel()
	hosts := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hosts <- r.Host
	}))
	t.Cleanup(srv.Close)
	p := cli.SignParams{Provider: "stripe", Secret: "whsec_host", Headers: http.Header{"Host": {"hooks.example.com"}}}
	ok, err := cli.SendSigned(t.Context(), io.Discard, p, srv.URL, 5*time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "hooks.example.com", <-hosts)
}
