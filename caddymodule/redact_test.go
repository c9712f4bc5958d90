package caddymodule

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Caddy's own error log line of a failed proxy prints the request's headers,
// and GitLab's X-Gitlab-Token is the secret itself (found by a new user's
// trial, with a route proxying to a dead upstream). The handler answers
// upstream errors itself, so no such line is written; an access log, which
// a site opts into, filters the signature headers as the README shows.
func TestSecretHeadersNotInCaddyLogs(t *testing.T) {
	dir := t.TempDir()
	errLog, accessLog := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close()) // connection refused from now on

	token := "gitlab-token-" + randomHex(12)
	stripeSecret := "whsec_" + randomHex(12)
	startCaddy(t, fmt.Sprintf(`{
`+caddyTestGlobals+`	log {
		output file %[1]q
		format json
	}
}
http://localhost:9080 {
	log {
		output file %[2]q
		format filter {
			wrap json
			fields {
				request>headers>X-Gitlab-Token replace REDACTED
				request>headers>Stripe-Signature replace REDACTED
			}
		}
	}
	handle /gitlab {
		webhook_idempotency {
			provider gitlab
			secret %[3]q
			storage sqlite %[4]q
		}
		reverse_proxy %[5]s
	}
	handle /stripe {
		webhook_idempotency {
			provider stripe
			secret %[6]q
			storage sqlite %[4]q
		}
		reverse_proxy %[5]s
	}
}`, errLog, accessLog, token, filepath.Join(dir, "events.db"), dead, stripeSecret))

	req, err := http.NewRequest(http.MethodPost, gatewayBase+"/gitlab", bytes.NewReader([]byte(`{"object_kind":"push"}`)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Gitlab-Token", token)
	req.Header.Set("X-Gitlab-Event-UUID", "uuid-"+randomHex(8))
	r := send(t, req)
	require.Equal(t, http.StatusBadGateway, r.status)
	require.JSONEq(t, `{"error":"upstream unavailable"}`, r.body)

	sreq := stripeDelivery(t, gatewayBase+"/stripe", stripeSecret, "evt_"+randomHex(8), time.Now())
	sig := sreq.Header.Get("Stripe-Signature")
	require.Equal(t, http.StatusBadGateway, send(t, sreq).status)

	bad := stripeDelivery(t, gatewayBase+"/stripe", "whsec_other", "evt_"+randomHex(8), time.Now())
	badSig := bad.Header.Get("Stripe-Signature")
	require.Equal(t, http.StatusBadRequest, send(t, bad).status)

	var logs []byte
	require.Eventually(t, func() bool {
		a, _ := os.ReadFile(accessLog)
		e, _ := os.ReadFile(errLog)
		logs = append(a, e...)
		return bytes.Count(logs, []byte(`"handled request"`)) >= 3 && bytes.Count(logs, []byte(`"upstream error"`)) >= 2
	}, 5*time.Second, 50*time.Millisecond, "the access log and the handler's upstream errors were written")
	require.NotContains(t, string(logs), `"http.log.error`, "no Caddy error line with the request's headers")
	require.Contains(t, string(logs), `"X-Gitlab-Token":"REDACTED"`, "the access log filter of the README")
	for _, s := range []string{token, sig, badSig, stripeSecret} {
		require.NotContains(t, string(logs), s)
	}
}
