package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// make demo with no gateway running must fail: every delivery is refused, so
// the exit status is 1 and stderr says what to start.
func TestSendWithoutGatewayFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now

	var out, errOut bytes.Buffer
	code := run([]string{"-url", "http://" + addr + "/webhooks/stripe", "-n", "2", "-payload", "../payloads/stripe_payment_intent_succeeded.json"}, &out, &errOut)
	require.Equal(t, 1, code, "stdout: %s", out.String())
	require.Contains(t, errOut.String(), "2 of 2 deliveries got no answer")
	require.Contains(t, errOut.String(), "make run")
}

// A gateway that answers, whatever the status (a 409 of a concurrent
// duplicate is the demo working), gives exit status 0.
func TestSendAnsweredSucceeds(t *testing.T) {
	var calls, signed int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++ // the deliveries are sent one after another
		if r.Header.Get("Stripe-Signature") != "" {
			signed++
		}
		if calls > 1 {
			w.WriteHeader(http.StatusConflict)
		}
	}))
	defer srv.Close()

	var out, errOut bytes.Buffer
	code := run([]string{"-url", srv.URL, "-n", "3", "-payload", "../payloads/stripe_payment_intent_succeeded.json"}, &out, &errOut)
	require.Equal(t, 0, code, "stderr: %s", errOut.String())
	require.Equal(t, 3, calls)
	require.Equal(t, 3, signed)
	require.Contains(t, out.String(), "delivery 2: 409")
}
