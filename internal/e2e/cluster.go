package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Temporary PostgreSQL clusters for the tests that stop, kill or fail over
// a server: each is initdb'd in a directory of its own under os.TempDir,
// listens on a free port of 127.0.0.1 (and a unix socket in its directory),
// trusts local logins, and is owned by the postgres user when the tests run
// as root (PostgreSQL refuses to run as root). Nothing here touches the
// machine's own cluster.

// PGBinDir is the directory of initdb, pg_ctl and pg_basebackup:
// $PG_BINDIR, else the newest /usr/lib/postgresql/<major>/bin (Debian's
// layout; scripts/ha-deps.sh prints the same).
func PGBinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) < majorOf(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("e2e: no PostgreSQL server binaries (set PG_BINDIR, or apt-get install postgresql)")
}

func majorOf(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

// runAs runs a PostgreSQL program as the postgres user when this process is
// root, else as itself, and returns its combined output.
func runAs(ctx context.Context, name string, args ...string) (string, error) {
	cmd := commandAs(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("e2e: %s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func commandAs(ctx context.Context, name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "PGTZ=UTC")
	return cmd
}

// tempDirFor creates a directory under os.TempDir that the postgres user
// owns when this process is root (under /tmp when the postgres user could
// not reach os.TempDir).
func tempDirFor(prefix string) (string, error) {
	base := os.TempDir()
	if os.Geteuid() == 0 && !traversable(base) {
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		return "", err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			_ = os.RemoveAll(dir)
			return "", fmt.Errorf("e2e: running as root needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// traversable reports whether every directory on the way to dir lets
// anyone through (the x bit for others).
func traversable(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

// Node is one PostgreSQL server of a temporary cluster.
type Node struct {
	// Name is the node's cluster_name, also the application_name a standby
	// streams under (what synchronous_standby_names matches).
	Name string
	// Port is its TCP port on 127.0.0.1.
	Port int
	// Data is its data directory.
	Data string

	bin string
}

// Addr is the node's 127.0.0.1:port.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// DSN is a superuser DSN for database db on this node alone.
func (n *Node) DSN(db string) string {
	return "postgres://postgres@" + n.Addr() + "/" + db + "?sslmode=disable"
}

func (n *Node) ctl(ctx context.Context, args ...string) error {
	_, err := runAs(ctx, filepath.Join(n.bin, "pg_ctl"), append([]string{"-D", n.Data}, args...)...)
	return err
}

// Start starts the server and waits (at most 60s) until it accepts logins.
func (n *Node) Start(ctx context.Context) error {
	if err := n.ctl(ctx, "-l", n.Data+".log", "-w", "-t", "60", "start"); err != nil {
		return err
	}
	return WaitReady(ctx, n.DSN("postgres"), 60*time.Second)
}

// Stop shuts the server down with mode "fast" (sessions are terminated
// with 57P01, a shutdown checkpoint is written) or "immediate" (every
// process quits at once, as on a crash; recovery runs at the next start),
// and waits for it to exit. Stopping a stopped server is not an error.
func (n *Node) Stop(ctx context.Context, mode string) error {
	if !n.Running() {
		return nil
	}
	return n.ctl(ctx, "-m", mode, "-w", "-t", "60", "stop")
}

// Running reports whether the node's postmaster is alive.
func (n *Node) Running() bool {
	b, err := os.ReadFile(filepath.Join(n.Data, "postmaster.pid"))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return err == nil && pid > 0 && syscall.Kill(pid, 0) == nil
}

// Promote ends recovery on a standby (pg_ctl promote) and waits until it
// accepts writes.
func (n *Node) Promote(ctx context.Context) error {
	return n.ctl(ctx, "-w", "-t", "60", "promote")
}

// Exec runs one statement on database db of this node.
func (n *Node) Exec(ctx context.Context, db, sql string) error {
	conn, err := pgx.Connect(ctx, n.DSN(db))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// WaitReady waits until dsn accepts a login, for at most limit.
func WaitReady(ctx context.Context, dsn string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		if err == nil {
			_ = conn.Close(cctx)
			cancel()
			return nil
		}
		cancel()
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("e2e: postgres did not accept logins within %s: %w", limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Replication is how a TempCluster's standby follows its primary.
type Replication string

const (
	// NoStandby makes a single primary.
	NoStandby Replication = ""
	// Async streams to the standby; a commit returns once flushed on the
	// primary (synchronous_standby_names empty).
	Async Replication = "async"
	// Sync makes every commit wait until the standby has flushed it
	// (synchronous_standby_names = the standby, synchronous_commit on).
	Sync Replication = "sync"
)

// TempCluster is a primary, and optionally a streaming standby made with
// pg_basebackup -R that streams through a Link, in a temporary directory.
type TempCluster struct {
	Dir     string
	Primary *Node
	// Standby is nil for NoStandby.
	Standby *Node
	// Replication is how Standby follows.
	Replication Replication
	// Link is the TCP relay the standby streams through: cutting it
	// partitions the standby from the primary (nil without a standby).
	Link *Link
}

// StartTempCluster initdb's and starts a primary on a free port and, unless
// repl is NoStandby, a standby streaming from it on another, and waits until
// the standby streams (as the synchronous standby for Sync). Close stops
// both and removes the directory.
func StartTempCluster(ctx context.Context, repl Replication) (*TempCluster, error) {
	bin, err := PGBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := tempDirFor("pgcluster-")
	if err != nil {
		return nil, err
	}
	c := &TempCluster{Dir: dir, Replication: repl}
	if err := c.start(ctx, bin, repl); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *TempCluster) start(ctx context.Context, bin string, repl Replication) error {
	p, err := newNode(bin, c.Dir, "primary")
	if err != nil {
		return err
	}
	c.Primary = p
	if _, err := runAs(ctx, filepath.Join(bin, "initdb"), "-D", p.Data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return err
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"port = " + strconv.Itoa(p.Port),
		"unix_socket_directories = '" + c.Dir + "'",
		"cluster_name = 'primary'",
		"max_connections = 200",
		"shared_buffers = 32MB",
		"wal_level = replica",
		"max_wal_senders = 5",
		"wal_keep_size = 128MB",
		"hot_standby = on",
		"synchronous_commit = on",
		"log_min_messages = warning",
	}
	if repl == Sync {
		conf = append(conf, "synchronous_standby_names = 'standby'")
	}
	if err := appendConf(ctx, p.Data, conf); err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	if repl == NoStandby {
		return nil
	}

	s, err := newNode(bin, c.Dir, "standby")
	if err != nil {
		return err
	}
	c.Standby = s
	link, err := NewLink(p.Addr())
	if err != nil {
		return err
	}
	c.Link = link
	_, linkPort, _ := net.SplitHostPort(link.Addr())
	// Through the link, so primary_conninfo (written by -R) names it too.
	if _, err := runAs(ctx, filepath.Join(bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", linkPort,
		"-U", "postgres", "-D", s.Data, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"); err != nil {
		return err
	}
	// The copied postgresql.conf is the primary's: the standby gets its own
	// port and name, and no synchronous standby of its own, or commits on it
	// would wait forever once it is promoted.
	if err := appendConf(ctx, s.Data, []string{
		"port = " + strconv.Itoa(s.Port),
		"cluster_name = 'standby'",
		"synchronous_standby_names = ''",
	}); err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return err
	}
	return c.WaitStreaming(ctx, 60*time.Second)
}

// WaitStreaming waits until the primary reports the standby streaming (and,
// for Sync, as its synchronous standby).
func (c *TempCluster) WaitStreaming(ctx context.Context, limit time.Duration) error {
	want := "async"
	if c.Replication == Sync {
		want = "sync"
	}
	deadline := time.Now().Add(limit)
	for {
		var state string
		conn, err := pgx.Connect(ctx, c.Primary.DSN("postgres"))
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT COALESCE(string_agg(state || '/' || sync_state, ','), '')
				FROM pg_stat_replication WHERE application_name = 'standby'`).Scan(&state)
			_ = conn.Close(ctx)
		}
		if err == nil && state == "streaming/"+want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("e2e: standby not streaming as %s within %s (state %q, err %v)", want, limit, state, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func newNode(bin, dir, name string) (*Node, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	return &Node{Name: name, Port: port, Data: filepath.Join(dir, name), bin: bin}, nil
}

// appendConf appends lines to the node's postgresql.conf (later lines win).
func appendConf(ctx context.Context, data string, lines []string) error {
	_, err := runAs(ctx, "sh", "-c", `printf '%s\n' "$@" >> "$0"`, filepath.Join(data, "postgresql.conf"), strings.Join(lines, "\n"))
	return err
}

// Nodes are the cluster's servers, primary first.
func (c *TempCluster) Nodes() []*Node {
	if c.Standby == nil {
		return []*Node{c.Primary}
	}
	return []*Node{c.Primary, c.Standby}
}

// DSN is the superuser DSN for database db: on the primary alone for a
// single server, else a multi-host DSN listing every node with
// target_session_attrs=read-write, as a gateway would be configured.
func (c *TempCluster) DSN(db string) string {
	return MultiHostDSN(db, c.Nodes()...)
}

// MultiHostDSN lists the nodes in one URL with target_session_attrs=read-write
// (libpq's form, which pgx parses: it tries the hosts in order and keeps the
// first that accepts writes).
func MultiHostDSN(db string, nodes ...*Node) string {
	hosts := make([]string, len(nodes))
	for i, n := range nodes {
		hosts[i] = n.Addr()
	}
	q := url.Values{"sslmode": {"disable"}}
	if len(nodes) > 1 {
		q.Set("target_session_attrs", "read-write")
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + db + "?" + q.Encode()
}

// Close stops every node at once (immediate) and removes the directory.
func (c *TempCluster) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range []*Node{c.Standby, c.Primary} {
		if n != nil {
			_ = n.Stop(ctx, "immediate")
		}
	}
	if c.Link != nil {
		c.Link.Close()
	}
	killLeftovers(c.Dir)
	_ = os.RemoveAll(c.Dir)
}

// killLeftovers ends every process still working in dir (its current
// directory is there, as every PostgreSQL process's is its data
// directory). The monitor's background workers outlived a postmaster
// killed while it shut down and ran on, orphaned, after make test ended.
func killLeftovers(dir string) {
	for range 3 {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		found := false
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
			if err == nil && (cwd == dir || strings.HasPrefix(cwd, dir+"/")) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		if !found {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Formation is a pg_auto_failover formation in a temporary directory: a
// monitor and two nodes, each a `pg_autoctl` process (Debian's
// postgresql-<major>-auto-failover; scripts/ha-deps.sh installs it) that
// keeps its Postgres running and fails over automatically. The monitor's
// health checks are tightened (1 s period, a node unhealthy after 3 s, 5 s
// for the old primary to demote itself) so a failover takes seconds, not
// the default tens of seconds.
type Formation struct {
	Dir     string
	Monitor *Node
	// Nodes are node1 (the first primary) and node2.
	Nodes []*Node
	// Sync is whether node2 is in the write quorum (synchronous
	// replication, pg_auto_failover's default); false sets
	// --replication-quorum false (asynchronous).
	Sync bool

	env   []string
	procs []*exec.Cmd
}

// monitorSettings shorten pg_auto_failover's detection of a failed node.
var monitorSettings = map[string]string{
	"health_check_period":               "1000",
	"health_check_timeout":              "1000",
	"health_check_max_retries":          "1",
	"health_check_retry_delay":          "500",
	"node_considered_unhealthy_timeout": "3000",
	"startup_grace_period":              "2000",
	// How long the new primary waits for the old one to demote itself
	// before it takes writes (default 30 s): it bounds the write outage.
	"primary_demote_timeout": "5000",
}

// StartFormation creates and runs a formation and waits (at most 2
// minutes) until node1 is primary and node2 secondary. Close stops it and
// removes the directory.
func StartFormation(ctx context.Context, sync bool) (*Formation, error) {
	bin, err := PGBinDir()
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		return nil, errors.New("e2e: pg_autoctl not found (scripts/ha-deps.sh installs pg_auto_failover)")
	}
	dir, err := tempDirFor("pgautofailover-")
	if err != nil {
		return nil, err
	}
	f := &Formation{Dir: dir, Sync: sync, env: []string{
		"HOME=" + dir, "XDG_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"XDG_DATA_HOME=" + filepath.Join(dir, "data"), "XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"),
	}}
	if err := f.start(ctx, bin); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (f *Formation) autoctl(ctx context.Context, args ...string) error {
	_, err := runAs(ctx, "env", append(append(append([]string{}, f.env...), "pg_autoctl"), args...)...)
	return err
}

// run starts a long-running pg_autoctl command in its own process group,
// logging to name.log.
func (f *Formation) run(name string, args ...string) error {
	cmd := commandAs(context.Background(), "env", append(append(append([]string{}, f.env...), "pg_autoctl"), args...)...)
	log, err := os.Create(filepath.Join(f.Dir, name+".log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	f.procs = append(f.procs, cmd)
	go func() { _ = cmd.Wait() }()
	return nil
}

func (f *Formation) start(ctx context.Context, bin string) error {
	pgctl := filepath.Join(bin, "pg_ctl")
	m, err := newNode(bin, f.Dir, "monitor")
	if err != nil {
		return err
	}
	f.Monitor = m
	if err := f.autoctl(ctx, "create", "monitor", "--pgdata", m.Data, "--pgport", strconv.Itoa(m.Port),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", pgctl); err != nil {
		return err
	}
	if err := f.run("monitor", "run", "--pgdata", m.Data); err != nil {
		return err
	}
	if err := WaitReady(ctx, m.DSN("pg_auto_failover"), 60*time.Second); err != nil {
		return err
	}
	for k, v := range monitorSettings {
		if err := m.Exec(ctx, "pg_auto_failover", "ALTER SYSTEM SET pgautofailover."+k+" = "+v); err != nil {
			return err
		}
	}
	if err := m.Exec(ctx, "pg_auto_failover", "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	monitorURI := "postgres://autoctl_node@" + m.Addr() + "/pg_auto_failover?sslmode=disable"
	for i, name := range []string{"node1", "node2"} {
		n, err := newNode(bin, f.Dir, name)
		if err != nil {
			return err
		}
		f.Nodes = append(f.Nodes, n)
		args := []string{"create", "postgres", "--pgdata", n.Data, "--pgport", strconv.Itoa(n.Port),
			"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", pgctl,
			"--monitor", monitorURI, "--name", name, "--run"}
		if i == 1 && !f.Sync {
			args = append(args, "--replication-quorum", "false")
		}
		if err := f.run(name, args...); err != nil {
			return err
		}
		want := map[string]string{"node1": "single"}
		if i == 1 {
			want = map[string]string{"node1": "primary", "node2": "secondary"}
		}
		if err := f.waitStates(ctx, want, 2*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// States reads each node's reported state from the monitor.
func (f *Formation) States(ctx context.Context) (map[string]string, error) {
	conn, err := pgx.Connect(ctx, f.Monitor.DSN("pg_auto_failover"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT nodename, reportedstate::text FROM pgautofailover.node`)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for rows.Next() {
		var name, state string
		if err := rows.Scan(&name, &state); err != nil {
			return nil, err
		}
		out[name] = state
	}
	return out, rows.Err()
}

// waitStates waits until every node in want reports its state there.
func (f *Formation) waitStates(ctx context.Context, want map[string]string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		got, err := f.States(ctx)
		match := err == nil
		for n, s := range want {
			match = match && got[n] == s
		}
		if match {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("e2e: pg_auto_failover states %v (err %v) within %s, want %v", got, err, limit, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// DSN is the multi-host DSN for database db over both nodes, the form
// `pg_autoctl show uri --formation default` prints.
func (f *Formation) DSN(db string) string { return MultiHostDSN(db, f.Nodes...) }

// StopNode stops a node's pg_autoctl and its Postgres with mode ("fast" or
// "immediate"), as when its host goes down: nothing restarts it.
func (f *Formation) StopNode(ctx context.Context, n *Node, mode string) error {
	return f.autoctl(ctx, "stop", "--pgdata", n.Data, "--"+mode)
}

// WaitPromoted waits (at most limit) until the monitor has promoted n
// (wait_primary or primary) and n commits a write.
func (f *Formation) WaitPromoted(ctx context.Context, n *Node, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		got, err := f.States(ctx)
		if err == nil && (got[n.Name] == "wait_primary" || got[n.Name] == "primary") {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = n.Exec(wctx, "postgres", "CREATE TABLE IF NOT EXISTS e2e_promoted (); DROP TABLE e2e_promoted")
			cancel()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("e2e: %s not promoted within %s (states %v, err %v)", n.Name, limit, got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Close stops every node and the monitor at once and removes the directory.
func (f *Formation) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range f.Nodes {
		_ = f.StopNode(ctx, n, "immediate")
	}
	if f.Monitor != nil {
		_ = f.StopNode(ctx, f.Monitor, "immediate")
	}
	for _, p := range f.procs {
		if p.Process != nil {
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
		}
	}
	for _, n := range append(append([]*Node{}, f.Nodes...), f.Monitor) {
		if n != nil {
			_ = n.Stop(ctx, "immediate")
		}
	}
	killLeftovers(f.Dir)
	_ = os.RemoveAll(f.Dir)
	// pg_autoctl keeps its pid files under $TMPDIR/pg_autoctl/<data
	// directory>, outside the formation's directory.
	for _, base := range []string{os.TempDir(), "/tmp"} {
		run := filepath.Join(base, "pg_autoctl")
		_ = os.RemoveAll(filepath.Join(run, f.Dir))
		for d := filepath.Dir(filepath.Join(run, f.Dir)); strings.HasPrefix(d, run); d = filepath.Dir(d) {
			if os.Remove(d) != nil { // not empty: another formation's
				break
			}
		}
	}
}
