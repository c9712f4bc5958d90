package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/e2e"
)

// runUpstream is the fast upstream: it reads the whole body and answers 200
// with a small JSON body. It runs as a child process (bench upstream
// -listen ADDR) so that its CPU is measured apart from the load generator's.
func runUpstream(args []string) {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address")
	delay := fs.Duration("delay", 0, "time each request takes (a slow legacy handler)")
	commitDSN := fs.String("commit-dsn", "", "the database of complete_by upstream's commit function")
	commitFn := fs.String("commit-fn", "", "complete_by upstream's commit function, e.g. bench_events_commit")
	_ = fs.Parse(args)
	// complete_by upstream: a request with a Webhook-Claim runs the one
	// transaction the upstream adds, the commit function's call, before
	// answering.
	var pool *pgxpool.Pool
	if *commitDSN != "" {
		var err error
		if pool, err = pgxpool.New(context.Background(), *commitDSN); err != nil {
			log.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ln.Addr().String()) // the parent reads the address
	answer := []byte(`{"ok":true}`)
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			time.Sleep(*delay)
			if claim := r.Header.Get("Webhook-Claim"); claim != "" && pool != nil {
				err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(r.Context(), `SELECT `+pgx.Identifier{*commitFn}.Sanitize()+`($1)`, claim)
					return err
				})
				if err != nil {
					http.Error(w, "not committed", http.StatusInternalServerError)
					return
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
			_, _ = w.Write(answer)
		}),
	}
	log.Fatal(srv.Serve(ln))
}

// child is a process this program started.
type child struct {
	name  string
	cmd   *exec.Cmd
	log   string
	done  chan struct{}
	admin string // Caddy's admin address with -pprof, else "off"
	dir   string
}

// profile fetches a CPU profile of du from Caddy's admin endpoint into the
// child's directory (with -pprof).
func (c *child) profile(du time.Duration) (string, error) {
	if c.admin == "" || c.admin == "off" {
		return "", nil
	}
	cl := &http.Client{Timeout: du + 30*time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.admin, int(du.Seconds())))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	path := filepath.Join(c.dir, "cpu.prof")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return path, err
}

// batchSizes returns the gateway's store_batch_size series from its
// admin API's /metrics (none with the admin API off).
func (c *child) batchSizes() []string {
	if c.admin == "" || c.admin == "off" {
		return nil
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + c.admin + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, "caddy_webhook_idempotency_store_batch_size") {
			lines = append(lines, l)
		}
	}
	return lines
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop sends SIGTERM, waits up to 10s, then kills.
func (c *child) stop() {
	if c == nil || c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// startUpstream starts the upstream child and returns it with its address.
// With commitDSN, a request carrying a Webhook-Claim calls commitFn in a
// transaction of its own on that database (complete_by upstream).
func startUpstream(ctx context.Context, delay time.Duration, commitDSN, commitFn string) (*child, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	args := []string{"upstream", "-listen", "127.0.0.1:0", "-delay", delay.String()}
	if commitDSN != "" {
		args = append(args, "-commit-dsn", commitDSN, "-commit-fn", commitFn)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	c := &child{name: "upstream", cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	addrCh := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			addrCh <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case addr := <-addrCh:
		return c, addr, nil
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	c.stop()
	return nil, "", errors.New("upstream did not start")
}

// startCaddy writes a Caddyfile with one site on a free loopback port whose
// only route is route, starts bin/caddy on it, and waits until it answers.
func startCaddy(ctx context.Context, c config, name, route string) (*child, string, error) {
	port, err := e2e.FreePort()
	if err != nil {
		return nil, "", err
	}
	safe := strings.NewReplacer("/", "-", " ", "-").Replace(name)
	home := filepath.Join(c.workdir, "caddy-"+safe)
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, "", err
	}
	admin := "off"
	if c.pprof {
		ap, err := e2e.FreePort()
		if err != nil {
			return nil, "", err
		}
		admin = fmt.Sprintf("127.0.0.1:%d", ap)
	}
	cf := fmt.Sprintf(`{
	admin %s
	auto_https off
	persist_config off
	grace_period 1s
	storage file_system %s
}

http://127.0.0.1:%d {
%s
}
`, admin, filepath.Join(home, "storage"), port, indent(route))
	cfPath := filepath.Join(home, "Caddyfile")
	if err := os.WriteFile(cfPath, []byte(cf), 0o600); err != nil {
		return nil, "", err
	}
	logPath := filepath.Join(home, "caddy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(filepath.Join(home, "tmp"), 0o700); err != nil {
		return nil, "", err
	}
	cmd := exec.Command(c.caddyBin, "run", "--config", cfPath, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+filepath.Join(home, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"), "HOME="+home, "TMPDIR="+filepath.Join(home, "tmp"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, "", fmt.Errorf("starting %s: %w", c.caddyBin, err)
	}
	ch := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{}), admin: admin, dir: home}
	go func() { _ = cmd.Wait(); logf.Close(); close(ch.done) }()

	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if ch.exited() {
			return nil, "", fmt.Errorf("caddy (%s) exited at start: %s", name, tail(logPath))
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			conn.Close()
			return ch, url, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	ch.stop()
	return nil, "", fmt.Errorf("caddy (%s) did not listen within 30s: %s", name, tail(logPath))
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "\t" + l
	}
	return strings.Join(lines, "\n")
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// cpuTicks is the user+system CPU time of a process, in clock ticks.
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// pgPIDs lists the PostgreSQL server processes whose CPU counts as this
// benchmark's, each with its pg_stat_activity.backend_type: the backends of
// its own sessions ("client backend"; application_name, set in the DSN by
// main, so the gateways' too) and the server's background processes
// ("walwriter", "checkpointer", "autovacuum worker", ...), which work for
// every commit. Other developers' sessions on the same server are left
// out. Nil when the server cannot be asked.
var pgPIDs func() map[int]string

// clientBackend is the backend_type of a session's backend; every other
// type is one of the server's background processes.
const clientBackend = "client backend"

// pgSample is one postgres process's backend_type and CPU time in ticks.
type pgSample struct {
	kind  string
	ticks int64
}

// postgresTicks samples the CPU time of each listed postgres process.
func postgresTicks(pids map[int]string) map[int]pgSample {
	m := make(map[int]pgSample, len(pids))
	for pid, kind := range pids {
		m[pid] = pgSample{kind: kind, ticks: cpuTicks(pid)}
	}
	return m
}

// pgDelta is the CPU the processes spent between two samples, in ticks by
// backend_type: for one seen in both, the difference; for one that
// appeared in between, all of it; one that exited in between is lost (its
// last ticks are unknown), and so is one that came and went within the
// window (a short autovacuum worker).
func pgDelta(before, after map[int]pgSample) map[string]int64 {
	d := map[string]int64{}
	for pid, a := range after {
		if b, ok := before[pid]; ok {
			d[a.kind] += max(a.ticks-b.ticks, 0)
		} else {
			d[a.kind] += a.ticks
		}
	}
	return d
}

// systemCPU returns busy and total jiffies of the whole machine.
func systemCPU() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	var v [10]int64
	for i := 1; i < len(f) && i <= 10; i++ {
		v[i-1], _ = strconv.ParseInt(f[i], 10, 64)
	}
	for _, x := range v[:8] { // user nice system idle iowait irq softirq steal
		total += x
	}
	idle := v[3] + v[4]
	return total - idle, total
}

// loadavg returns /proc/loadavg's first three fields.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
