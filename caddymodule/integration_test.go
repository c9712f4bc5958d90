package caddymodule

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/stretchr/testify/require"
)

// These tests drive a real in-process Caddy (caddytest) with the module in
// front of a counting upstream, on the real PostgreSQL and on SQLite. Caddy's
// config and ports are global: no t.Parallel here. They skip under -short.

const gatewayBase = "http://localhost:9080"

// caddyTestGlobals are the global options of every in-process Caddy test:
// caddytest's admin port, fixed HTTP ports, no trust store, no grace period.
const caddyTestGlobals = "\tskip_install_trust\n\tadmin localhost:2999\n\thttp_port 9080\n\thttps_port 9443\n\tgrace_period 1ns\n"

// countingUpstream records every forwarded delivery by event ID.
type countingUpstream struct {
	*httptest.Server
	mu     sync.Mutex
	calls  map[string]int
	bodies map[string][][]byte
	status atomic.Int32 // answer status; 0 = 200
	delay  atomic.Int64 // nanoseconds to wait before answering
}

func newCountingUpstream(t *testing.T) *countingUpstream {
	u := &countingUpstream{calls: map[string]int{}, bodies: map[string][][]byte{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("X-Test-Event")
		u.mu.Lock()
		u.calls[id]++
		u.bodies[id] = append(u.bodies[id], body)
		u.mu.Unlock()
		if d := u.delay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		st := int(u.status.Load())
		if st == 0 {
			st = http.StatusOK
		}
		w.WriteHeader(st)
		_, _ = io.WriteString(w, `{"upstream":true}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *countingUpstream) count(id string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[id]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// stripeDelivery builds a Stripe-signed delivery the way Stripe sends one.
func stripeDelivery(t *testing.T, url, secret, id string, ts time.Time) *http.Request {
	t.Helper()
	body := []byte(fmt.Sprintf("{\n  \"id\": %q,\n  \"object\": \"event\",\n  \"type\": \"payment_intent.succeeded\"\n}\n", id))
	tsText := strconv.FormatInt(ts.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(tsText + "."))
	mac.Write(body)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Stripe-Signature", "t="+tsText+",v1="+hex.EncodeToString(mac.Sum(nil)))
	req.Header.Set("X-Test-Event", id)
	return req
}

type result struct {
	status   int
	body     string
	replayed bool
	retry    string
}

func send(t *testing.T, req *http.Request) result {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true", resp.Header.Get("Retry-After")}
}

// startGateway loads a Caddy config with one route per backend, both in
// front of the upstream, and returns the route prefixes. The routes have
// scopes of their own: one scope on two storages is refused at load.
func startGateway(t *testing.T, up *countingUpstream, secret string, extra string) map[string]string {
	if testing.Short() {
		t.Skip("in-process Caddy: skipped with -short")
	}
	dsn := pgDSN(t)
	table := "it_" + randomHex(6)
	t.Cleanup(func() { dropTable(dsn, table) })
	dbPath := filepath.Join(t.TempDir(), "events.db")
	tester := caddytest.NewTester(t)
	tester.InitServer(fmt.Sprintf(`{
`+caddyTestGlobals+`}
http://localhost:9080 {
	handle /postgres/* {
		webhook_idempotency {
			provider stripe
			secret %[1]q
			storage postgres %[2]q
			table %[3]s
			scope stripe_pg
			%[5]s
		}
		reverse_proxy %[6]s
	}
	handle /sqlite/* {
		webhook_idempotency {
			provider stripe
			secret %[1]q
			storage sqlite %[4]q
			scope stripe_lite
			%[5]s
		}
		reverse_proxy %[6]s
	}
}`, secret, dsn, table, dbPath, extra, up.Listener.Addr().String()), "caddyfile")
	require.False(t, t.Failed(), "caddy config did not load")
	return map[string]string{"postgres": gatewayBase + "/postgres/hook", "sqlite": gatewayBase + "/sqlite/hook"}
}

func TestGatewayEndToEnd(t *testing.T) {
	secret := "whsec_" + randomHex(16)
	up := newCountingUpstream(t)
	routes := startGateway(t, up, secret, "lease 3s")

	for _, backend := range []string{"postgres", "sqlite"} {
		url := routes[backend]

		t.Run(backend+"/first delivery forwarded with exact bytes", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			req := stripeDelivery(t, url, secret, id, time.Now())
			want, _ := io.ReadAll(req.Body)
			req.Body = io.NopCloser(bytes.NewReader(want))
			r := send(t, req)
			require.Equal(t, 200, r.status)
			require.JSONEq(t, `{"upstream":true}`, r.body)
			require.False(t, r.replayed)
			require.Equal(t, 1, up.count(id))
			up.mu.Lock()
			require.Equal(t, want, up.bodies[id][0])
			up.mu.Unlock()
		})

		t.Run(backend+"/five sequential redeliveries forwarded once", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			require.Equal(t, 200, send(t, stripeDelivery(t, url, secret, id, time.Now())).status)
			for range 5 {
				r := send(t, stripeDelivery(t, url, secret, id, time.Now()))
				require.Equal(t, 200, r.status)
				require.True(t, r.replayed, "Idempotent-Replayed: true")
				require.JSONEq(t, `{"received":true,"duplicate":true}`, r.body)
			}
			require.Equal(t, 1, up.count(id))
		})

		t.Run(backend+"/50 concurrent deliveries forwarded once", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			up.delay.Store(int64(300 * time.Millisecond))
			defer up.delay.Store(0)
			var wg sync.WaitGroup
			results := make([]result, 50)
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i] = send(t, stripeDelivery(t, url, secret, id, time.Now()))
				}()
			}
			wg.Wait()
			var fromUpstream, inFlight, replayed int
			for _, r := range results {
				switch {
				case r.status == 200 && r.replayed:
					replayed++
				case r.status == 200:
					fromUpstream++
				case r.status == 409:
					inFlight++
					require.NotEmpty(t, r.retry, "409 carries Retry-After")
				default:
					t.Fatalf("unexpected answer %d %s", r.status, r.body)
				}
			}
			require.Equal(t, 1, fromUpstream)
			require.Equal(t, 49, inFlight+replayed)
			require.Equal(t, 1, up.count(id))
		})

		t.Run(backend+"/upstream 500 releases the claim and the retry is forwarded", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			up.status.Store(500)
			r := send(t, stripeDelivery(t, url, secret, id, time.Now()))
			up.status.Store(0)
			require.Equal(t, 500, r.status)
			r = send(t, stripeDelivery(t, url, secret, id, time.Now()))
			require.Equal(t, 200, r.status)
			require.False(t, r.replayed)
			r = send(t, stripeDelivery(t, url, secret, id, time.Now()))
			require.True(t, r.replayed)
			require.Equal(t, 2, up.count(id))
		})

		t.Run(backend+"/invalid signatures are refused and not recorded", func(t *testing.T) {
			id := "evt_" + randomHex(8)
			r := send(t, stripeDelivery(t, url, "whsec_other", id, time.Now()))
			require.Equal(t, 400, r.status)
			require.Contains(t, r.body, `"error"`)
			old := send(t, stripeDelivery(t, url, secret, id, time.Now().Add(-10*time.Minute)))
			require.Equal(t, 400, old.status)
			require.NotEqual(t, r.body, old.body, "distinct reasons")
			req := stripeDelivery(t, url, secret, id, time.Now())
			req.Header.Del("Stripe-Signature")
			require.Equal(t, 400, send(t, req).status)
			require.Equal(t, 0, up.count(id))
			// Nothing was recorded: the valid delivery is forwarded.
			require.Equal(t, 200, send(t, stripeDelivery(t, url, secret, id, time.Now())).status)
			require.Equal(t, 1, up.count(id))
		})
	}
}
