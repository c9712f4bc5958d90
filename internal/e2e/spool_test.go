package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// Issue 20, item 4: GitHub does not redeliver a failed delivery, so a store
// outage must not lose one. A GitHub route (spool on by default) on a
// temporary PostgreSQL that is stopped for 30 s gets 110 deliveries of 100
// events (10 delivered a second time, later) during the outage: every one is
// answered 2xx (kept in the spool), and once PostgreSQL is back each event
// is forwarded exactly once: 0 lost, 0 doubled.
//
// "kill -9" does the same with two gateways (each with its own spool) behind
// one address: half way through the outage gateway a is killed with
// SIGKILL, the rest of the deliveries go to b, and a is started again once
// PostgreSQL is back (TestSpoolKeepsGitHubDeliveriesWhenStoreDownAtStart
// starts one while the store is down). Both spools hold deliveries of the same events; the store's claims
// decide which forwards.
func TestSpoolKeepsGitHubDeliveriesThroughStoreOutage(t *testing.T) {
	disruptive(t)
	for _, kill := range []bool{false, true} {
		name := "store down 30s"
		if kill {
			name += ", gateway killed -9"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pg := tempCluster(t, e2e.NoStandby)
			server := pg.Primary
			b := setupOn(t, pg.DSN("postgres"), func(string, int) e2e.Answer { return e2e.Answer{} })
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				if !server.Running() {
					if err := server.Start(ctx); err != nil {
						t.Errorf("restarting postgres: %v", err)
					}
				}
			})
			spoolOutage(t, b, b.db.DSN, storeOutage{
				down: func(ctx context.Context) error { return server.Stop(ctx, "fast") },
				up:   server.Start,
				for_: 30 * time.Second, events: 100,
			}, kill)
		})
	}
}

// The same through a cut TCP link to the test database (the gateways'
// connections closed, new ones refused), shorter and smaller, so it runs
// with the ordinary end-to-end tests: 33 deliveries of 30 events during
// 6 s, with and without a gateway killed.
func TestSpoolKeepsGitHubDeliveriesThroughCutStoreLink(t *testing.T) {
	t.Parallel()
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("kill %v", kill), func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
			link := b.storeLink()
			spoolOutage(t, b, b.db.DSNVia(link.Addr()), storeOutage{
				down: func(context.Context) error { link.Cut(); return nil },
				up:   func(context.Context) error { link.Restore(); return nil },
				for_: 6 * time.Second, events: 30,
			}, kill)
		})
	}
}

// The store is unreachable when the gateways start (a crash-restart or a
// rolling deploy during a database outage, or docker compose starting the
// gateway before PostgreSQL): they start all the same, answer every
// delivery 200 from the spool, and once the link to the store is restored
// they migrate the schema and forward each event exactly once. With the
// kill, gateway a is killed with SIGKILL half way and started again at once,
// while the store is still unreachable; it delivers what its spool held
// before the kill too.
func TestSpoolKeepsGitHubDeliveriesWhenStoreDownAtStart(t *testing.T) {
	t.Parallel()
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("kill %v", kill), func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
			link := b.storeLink()
			spoolOutage(t, b, b.db.DSNVia(link.Addr()), storeOutage{
				down: func(context.Context) error { link.Cut(); return nil },
				up:   func(context.Context) error { link.Restore(); return nil },
				for_: 6 * time.Second, events: 30, atStart: true,
			}, kill)
		})
	}
}

// A store the gateway reaches but that refuses it is a configuration only
// an operator fixes: the config fails to load, naming the storage (no
// password) and the server's reason, rather than a gateway waiting
// forever. An unknown role is refused as a wrong password is (SQLSTATE
// class 28, invalid authorization); a database that does not exist and a
// malformed DSN fail the same way.
func TestStoreMisconfiguredFailsAtLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	u, err := url.Parse(b.db.DSN)
	require.NoError(t, err)
	withUser := *u
	withUser.User = url.UserPassword("no_such_role_"+e2e.RandomHex(4), "s3cret-pw")
	noDB := *u
	noDB.Path = "/no_such_db_" + e2e.RandomHex(4)
	for _, c := range []struct{ name, dsn, want string }{
		{"unknown role", withUser.String(), "28000"},
		{"unknown database", noDB.String(), "3D000"},
		{"malformed DSN", "postgres://postgres@127.0.0.1:notaport/x", "parsing postgres DSN"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e2e.StartGateway(e2e.GatewayConfig{Name: "bad-" + e2e.RandomHex(4), Binary: caddyBin, Dir: b.dir,
				Upstream: b.up.Addr(), Handler: e2e.GitHubHandler(b.secret, c.dsn)})
			require.Error(t, err, "the config must not load")
			require.Contains(t, err.Error(), "exited while starting")
			require.Contains(t, err.Error(), c.want)
			require.NotContains(t, err.Error(), "s3cret-pw", "no password in the error")
		})
	}
}

// storeOutage takes the store away and brings it back.
type storeOutage struct {
	down, up func(context.Context) error
	for_     time.Duration
	events   int // every tenth is delivered twice
	// atStart: the store goes away before the gateways start (none of
	// them has reached it); a killed gateway is started again at once.
	atStart bool
}

// spoolOutage delivers o.events GitHub events (every tenth twice) to
// gateways on dsn while the store is down for o.for_, and checks that each
// is answered 2xx and, once the store is back, forwarded exactly once.
// kill: two gateways, a killed with SIGKILL half way and started again
// once the store is back.
func spoolOutage(t *testing.T, b *bundle, dsn string, o storeOutage, kill bool) {
	downtime, events := o.for_, o.events
	cfgOf := func(name string) e2e.GatewayConfig {
		return e2e.GatewayConfig{Name: name, Upstream: b.up.Addr(), Admin: true,
			Handler: e2e.GitHubHandler(b.secret, dsn)} // no spool line: on by default for github
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if o.atStart {
		require.NoError(t, o.down(ctx))
	}
	downAt := time.Now()
	a := b.start(cfgOf("a"))
	gws := []*e2e.Gateway{a}
	var gb *e2e.Gateway
	if kill {
		gb = b.start(cfgOf("b"))
		gws = append(gws, gb)
	}
	deliver := func(g *e2e.Gateway, id string) e2e.Result { return b.deliverGitHub(g.URL(), id) }
	for _, g := range gws {
		if o.atStart {
			break
		}
		warm := "warm-" + g.Name + "-" + e2e.RandomHex(6)
		require.True(t, deliver(g, warm).Forwarded(), "the store is up: forwarded at once")
	}

	// The events; every tenth is delivered a second time three arrivals
	// later.
	var ids, arrivals []string
	for i := range events {
		id := fmt.Sprintf("%08x-%04d-4000-8000-%012d", i, i, i)
		ids = append(ids, id)
		arrivals = append(arrivals, id)
		if i%10 == 5 {
			arrivals = append(arrivals, ids[i-3])
		}
	}
	require.Len(t, arrivals, events+events/10)

	if !o.atStart {
		require.NoError(t, o.down(ctx))
		downAt = time.Now()
	}
	interval := (downtime - downtime/15) / time.Duration(len(arrivals))
	statuses := map[int]int{}
	for i, id := range arrivals {
		g := a
		switch {
		case kill && i == len(arrivals)/2:
			a.Kill() // SIGKILL, between two answered deliveries
			g = gb
			if o.atStart {
				// Started again with the store still unreachable: same
				// name, same data directory, its spool.
				a = b.start(cfgOf("a"))
			}
		case kill && o.atStart && i%2 == 1:
			g = gb
		case kill && (i > len(arrivals)/2 || i%2 == 1):
			g = gb
		}
		r := deliver(g, id)
		statuses[r.Status]++
		require.True(t, r.OK(), "delivery %d (%s) to %s during the outage: %d %s", i, id, g.Name, r.Status, r.Body)
		require.Contains(t, r.Body, `"spooled":true`)
		time.Sleep(time.Until(downAt.Add(time.Duration(i+1) * interval)))
	}
	// What waits is visible: metrics and the admin API (no header or body
	// in either).
	last := gws[len(gws)-1]
	waiting, err := last.Metric(ctx, spoolSeries(last, "records"))
	require.NoError(t, err)
	require.Positive(t, waiting)
	down, err := last.Metric(ctx, spoolSeries(last, "store_down"))
	require.NoError(t, err)
	require.InDelta(t, 1, down, 0, "the spool knows the store is down")
	status, body, err := last.AdminCall(ctx, http.MethodGet, "/webhook_idempotency/spool")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, body)
	var listed []struct {
		Dir        string  `json:"dir"`
		Records    int     `json:"records"`
		OldestAge  float64 `json:"oldest_age_seconds"`
		StoreDown  bool    `json:"store_down"`
		Deliveries []struct {
			Seq     uint64 `json:"seq"`
			EventID string `json:"event_id"`
		} `json:"deliveries"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, last.SpoolDir("github"), listed[0].Dir)
	require.InDelta(t, waiting, listed[0].Records, 0)
	require.Positive(t, listed[0].OldestAge)
	require.True(t, listed[0].StoreDown)
	require.NotEmpty(t, listed[0].Deliveries)
	require.NotContains(t, body, "sha256=", "no signature in the admin API")
	require.NotContains(t, body, "octocat", "no body in the admin API")
	if o.atStart {
		// The events admin API says why it cannot answer.
		status, body, err := last.AdminCall(ctx, http.MethodGet, "/webhook_idempotency/events/github/"+ids[0])
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, status, body)
		require.Contains(t, body, "has not been reached and migrated since the gateway started")
		// Only a dead delivery (refused for 72 h) is dropped; none is dead.
		seq := strconv.FormatUint(listed[0].Deliveries[0].Seq, 10)
		status, body, err = last.AdminCall(ctx, http.MethodPost, "/webhook_idempotency/spool/drop?seq="+seq)
		require.NoError(t, err)
		require.Equal(t, http.StatusConflict, status, body)
		require.Contains(t, body, "is not dead")
		status, body, err = last.AdminCall(ctx, http.MethodPost, "/webhook_idempotency/spool/retry")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, body)
		require.JSONEq(t, `{"retried":0}`, body)
	}
	time.Sleep(time.Until(downAt.Add(downtime)))
	require.Empty(t, b.up.Snapshot()[ids[0]], "nothing forwarded while the store is down")
	require.NoError(t, o.up(ctx))
	upAt := time.Now()
	if kill && !o.atStart {
		a = b.start(cfgOf("a")) // same name, same data directory: its spool
	}

	// Every event forwarded: wait for the last one, then give doubles a
	// chance to show.
	for _, id := range ids {
		require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) >= 1 }), "event %s", id)
	}
	drained := time.Since(upAt)
	for _, g := range []*e2e.Gateway{a, gb} {
		if g == nil {
			continue
		}
		require.Eventually(t, func() bool {
			n, err := g.Metric(ctx, spoolSeries(g, "records"))
			return err == nil && n == 0
		}, 30*time.Second, 100*time.Millisecond, "spool of %s drained", g.Name)
	}
	time.Sleep(2 * time.Second)

	lost, doubled := 0, 0
	for _, id := range ids {
		calls := b.up.Calls(id)
		switch {
		case len(calls) == 0:
			lost++
		case len(calls) > 1:
			doubled++
		}
		require.Equal(t, 1, b.up.Successes(id), "event %s: calls %v", id, calls)
		row, ok, err := b.db.Row(ctx, "", "github", id)
		require.NoError(t, err)
		require.True(t, ok, "event %s has a row", id)
		require.Equal(t, "completed", row.State, "event %s", id)
	}
	require.Zero(t, lost)
	require.Zero(t, doubled)

	if o.atStart {
		// One warning per start, not one per try; one line when the store
		// is reached.
		starts := 1
		if kill {
			starts = 2
		}
		require.Equal(t, starts, logLines(a, `"level":"warn"`, "the store is unreachable; the gateway starts without it"))
		require.Equal(t, 1, logLines(a, `"level":"info"`, "the store is reached and migrated"))
	}
	if !kill {
		forwarded, err := a.Metric(ctx, spoolSeries(a, "settled_total", `outcome="forwarded"`))
		require.NoError(t, err)
		dups, err := a.Metric(ctx, spoolSeries(a, "settled_total", `outcome="duplicate"`))
		require.NoError(t, err)
		require.InDelta(t, events, forwarded, 0)
		require.InDelta(t, events/10, dups, 0)
	}
	t.Logf("%d deliveries of %d events during a %s outage (answers %v); all forwarded %s after the store came back: lost %d, doubled %d",
		len(arrivals), events, downtime, statuses, drained.Round(100*time.Millisecond), lost, doubled)
}

// spoolSeries is the name of a spool metric of gateway g, with its spool
// label (the default directory of scope github in g's data directory).
func spoolSeries(g *e2e.Gateway, name string, labels ...string) string {
	l := fmt.Sprintf(`spool=%q`, g.SpoolDir("github"))
	for _, x := range labels {
		l = x + "," + l
	}
	return "caddy_webhook_idempotency_spool_" + name + "{" + l + "}"
}

// Two Caddy processes on one machine given one spool directory: the second
// refuses to start (its config does not load), naming the directory's
// holder and what to write instead, while caddy validate of the first's
// config succeeds; once the first is gone (even killed), the directory is
// free.
func TestSpoolDirectoryServesOneProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	dir := filepath.Join(b.dir, "shared-spool")
	cfgOf := func(name string) e2e.GatewayConfig {
		return e2e.GatewayConfig{Name: name, Binary: caddyBin, Dir: b.dir, Upstream: b.up.Addr(),
			Handler: e2e.GitHubHandler(b.secret, b.db.DSN, "spool "+dir)}
	}
	a := b.start(cfgOf("a"))
	// Validating the running config next to it (before a reload) is not
	// a second gateway: it checks the directory and leaves the spool alone.
	for _, args := range [][]string{{"validate"}, {"adapt", "--validate"}} {
		out, err := exec.Command(caddyBin, append(args, "--config", filepath.Join(b.dir, "a.Caddyfile"), "--adapter", "caddyfile")...).CombinedOutput() //nolint:gosec // the test's own binary
		require.NoError(t, err, "caddy %s while a runs: %s", args, out)
	}
	_, err := e2e.StartGateway(cfgOf("b"))
	require.Error(t, err, "a second process on the same spool directory")
	require.Contains(t, err.Error(), "in use by another process (pid ")
	require.Contains(t, err.Error(), "spool off")

	a.Kill() // SIGKILL: the kernel drops the lock
	b.start(cfgOf("b2"))
}

// spoolDrainEnv turns on TestSpoolDrainBacklog, a measurement rather than
// a check of the ordinary run.
const spoolDrainEnv = "E2E_SPOOL_DRAIN"

// How fast a spool's backlog goes out once the store is back
// (docs/spool.md, "Measured"): 2,000 GitHub deliveries of 2,000 events are
// spooled while the link to the store is cut, then the link is restored.
// The rate is the backlog over the time from the first of its forwards to
// the last (the spool's wait for the store, up to 5 s, left out). Each
// event is forwarded once.
func TestSpoolDrainBacklog(t *testing.T) {
	if os.Getenv(spoolDrainEnv) != "1" {
		t.Skip("a measurement; set " + spoolDrainEnv + "=1")
	}
	const backlog, senders = 2000, 16
	b := setup(t, func(string, int) e2e.Answer { return e2e.Answer{} })
	link := b.storeLink()
	g := b.start(e2e.GatewayConfig{Name: "drain", Upstream: b.up.Addr(), Admin: true, LogLevel: "WARN",
		Handler: e2e.GitHubHandler(b.secret, b.db.DSNVia(link.Addr()))})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r, err := e2e.DeliverGitHub(ctx, b.client, g.URL(), b.secret, "warm-"+e2e.RandomHex(6))
	require.NoError(t, err)
	require.True(t, r.Forwarded())

	link.Cut()
	ids := make([]string, backlog)
	for i := range ids {
		ids[i] = fmt.Sprintf("%08x-%04d-4000-8000-%012d", i, i%10000, i)
	}
	next := make(chan string)
	errs := make(chan error, senders)
	for range senders {
		go func() {
			for id := range next {
				r, err := e2e.DeliverGitHub(ctx, b.client, g.URL(), b.secret, id)
				if err == nil && !strings.Contains(r.Body, `"spooled":true`) {
					err = fmt.Errorf("%s: %d %s", id, r.Status, r.Body)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	t0 := time.Now()
	for _, id := range ids {
		next <- id
	}
	close(next)
	for range senders {
		require.NoError(t, <-errs)
	}
	spooled := time.Since(t0)

	link.Restore()
	for _, id := range ids {
		require.NoError(t, b.up.WaitFor(ctx, id, func(cs []e2e.Call) bool { return len(cs) >= 1 }), "event %s", id)
	}
	var first, last time.Time
	for _, id := range ids {
		calls := b.up.Calls(id)
		require.Len(t, calls, 1, "event %s forwarded once", id)
		require.True(t, calls[0].Success())
		if first.IsZero() || calls[0].At.Before(first) {
			first = calls[0].At
		}
		if calls[0].Done.After(last) {
			last = calls[0].Done
		}
	}
	took := last.Sub(first)
	t.Logf("%d deliveries spooled in %s (%.0f/s, %d senders); drained in %s: %.0f deliveries/s",
		backlog, spooled.Round(time.Millisecond), float64(backlog)/spooled.Seconds(), senders,
		took.Round(time.Millisecond), float64(backlog)/took.Seconds())
}
