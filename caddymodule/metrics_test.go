package caddymodule

import (
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// scrape reads the gateway's /metrics with Prometheus' text parser.
func scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(gatewayBase + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// series returns the metrics of a family whose labels include want, keyed
// by the value of label key.
func series(families map[string]*dto.MetricFamily, name, key string, want map[string]string) map[string]*dto.Metric {
	out := map[string]*dto.Metric{}
	mf := families[name]
	if mf == nil {
		return out
	}
next:
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		out[labels[key]] = m
	}
	return out
}

// outcomeCounts is caddy_webhook_idempotency_deliveries_total of a scope, by
// outcome.
func outcomeCounts(t *testing.T, scope string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for outcome, m := range series(scrape(t), "caddy_webhook_idempotency_deliveries_total", "outcome",
		map[string]string{"scope": scope, "provider": "stripe"}) {
		out[outcome] = m.GetCounter().GetValue()
	}
	return out
}

func gaugeInFlight(t *testing.T, scope string) float64 {
	t.Helper()
	m := series(scrape(t), "caddy_webhook_idempotency_claims_in_flight", "scope", map[string]string{"scope": scope})[scope]
	require.NotNil(t, m, "claims_in_flight{scope=%q} not exposed", scope)
	return m.GetGauge().GetValue()
}

func TestMetricsCountOutcomes(t *testing.T) {
	secret := "whsec_" + randomHex(16)
	g := startOpsGateway(t, opsConfig{secrets: []string{secret}, extra: "max_body 1KB"})
	deliver := func(id string, body []byte, signWith string) result {
		t.Helper()
		return send(t, stripeRequest(t, g.url, signWith, body, time.Now(), id))
	}

	// Before any delivery every outcome of the scope is exposed, at 0.
	zero := outcomeCounts(t, g.scope)
	require.Len(t, zero, len(allOutcomes))
	for _, o := range allOutcomes {
		require.Contains(t, zero, o)
		require.Zero(t, zero[o], o)
	}

	a, b, c := "evt_a_"+randomHex(4), "evt_b_"+randomHex(4), "evt_c_"+randomHex(4)

	require.Equal(t, 200, deliver(a, stripeBody(a, ""), secret).status) // completed
	require.True(t, deliver(a, stripeBody(a, ""), secret).replayed)     // duplicate

	g.up.answer(b, http.StatusInternalServerError)
	require.Equal(t, 500, deliver(b, stripeBody(b, ""), secret).status) // released
	g.up.answer(b, http.StatusOK)
	require.Equal(t, 200, deliver(b, stripeBody(b, ""), secret).status) // completed

	// c's forward waits in the upstream: a redelivery meanwhile is in
	// flight, and the claim shows in the gauge.
	release := g.up.hold(c)
	defer release()
	first := make(chan result, 1)
	go func() { first <- send(t, stripeRequest(t, g.url, secret, stripeBody(c, ""), time.Now(), c)) }()
	select {
	case <-g.up.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first delivery of c never reached the upstream")
	}
	r := deliver(c, stripeBody(c, ""), secret)
	require.Equal(t, http.StatusConflict, r.status, r.body) // in_flight
	require.NotEmpty(t, r.retry)
	require.Equal(t, 1.0, gaugeInFlight(t, g.scope))
	release()
	require.Equal(t, 200, (<-first).status) // completed

	require.Equal(t, 400, deliver("bad_sig", stripeBody("evt_x", ""), "whsec_wrong").status) // invalid_signature
	req := stripeRequest(t, g.url, secret, stripeBody("evt_y", ""), time.Now(), "no_header")
	req.Header.Del("Stripe-Signature")
	require.Equal(t, 400, send(t, req).status) // invalid_signature

	noID := []byte(`{"object":"event","type":"payment_intent.succeeded"}`)
	require.Equal(t, 400, deliver("no_id", noID, secret).status) // bad_request

	big := stripeBody("evt_big", strings.Repeat("x", 2000))
	require.Equal(t, http.StatusRequestEntityTooLarge, deliver("big", big, secret).status) // too_large

	require.True(t, deliver(a, stripeBody(a, ""), secret).replayed) // duplicate

	want := map[string]float64{}
	for _, o := range allOutcomes {
		want[o] = 0
	}
	want[outcomeCompleted] = 3
	want[outcomeDuplicate] = 2
	want[outcomeReleased] = 1
	want[outcomeInFlight] = 1
	want[outcomeInvalidSignature] = 2
	want[outcomeBadRequest] = 1
	want[outcomeTooLarge] = 1

	// A delivery is counted as its handler returns, which may be just after
	// the client has its answer.
	got := outcomeCounts(t, g.scope)
	for deadline := time.Now().Add(5 * time.Second); !maps.Equal(want, got) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		got = outcomeCounts(t, g.scope)
	}
	require.Equal(t, want, got)

	require.Equal(t, 0.0, gaugeInFlight(t, g.scope))
	// Forwards timed: a, b twice, c.
	up := series(scrape(t), "caddy_webhook_idempotency_upstream_duration_seconds", "scope",
		map[string]string{"scope": g.scope, "provider": "stripe"})[g.scope]
	require.NotNil(t, up)
	require.EqualValues(t, 4, up.GetHistogram().GetSampleCount())
	require.Equal(t, 1, g.up.count(a))
	require.Equal(t, 2, g.up.count(b))
	require.Equal(t, 1, g.up.count(c))

	// The store's batches (process-wide, so at least this test's): four
	// claims that reached the store (a, b twice, c twice at least), three
	// completes, one release, each batch a transaction.
	batches := series(scrape(t), "caddy_webhook_idempotency_store_batch_size", "op", nil)
	for op, least := range map[string]float64{"claim": 4, "complete": 3, "release": 1} {
		require.NotNil(t, batches[op], "store_batch_size{op=%q} not exposed", op)
		require.GreaterOrEqual(t, batches[op].GetHistogram().GetSampleSum(), least, op)
	}
	require.NotNil(t, batches["transaction"])
	require.Positive(t, batches["transaction"].GetHistogram().GetSampleCount())
}
