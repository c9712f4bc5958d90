package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncerConfig describes a PgBouncer in transaction pooling in front of
// one PostgreSQL server, as production pools it.
type PgBouncerConfig struct {
	// Target is the PostgreSQL server, host:port. Every database name is
	// passed through (the [databases] wildcard), trust auth as the server.
	Target string
	// PoolSize is default_pool_size: server connections per database and
	// user. Defaults to 4.
	PoolSize int
	// MaxClientConn is max_client_conn. Defaults to 400.
	MaxClientConn int
	// RoundRobin sets server_round_robin = 1: server connections are used
	// in turn instead of the most recent one first, so consecutive
	// transactions of one client land on different servers.
	RoundRobin bool
}

// PgBouncer is a running PgBouncer on a free port of 127.0.0.1, run as the
// postgres user when the tests run as root (PgBouncer refuses root).
type PgBouncer struct {
	// Addr is its 127.0.0.1:port.
	Addr string

	dir string
	cmd *exec.Cmd
}

// PgBouncerBinary is $PGBOUNCER, else pgbouncer on PATH or in /usr/sbin
// (Debian's package; scripts/pgbouncer.sh installs it).
func PgBouncerBinary() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", errors.New("e2e: pgbouncer not found (scripts/pgbouncer.sh installs it: apt-get install pgbouncer)")
}

// StartPgBouncer writes the configuration to a temporary directory, starts
// PgBouncer and waits (at most 15s) until it relays a query to the target.
func StartPgBouncer(ctx context.Context, cfg PgBouncerConfig) (*PgBouncer, error) {
	bin, err := PgBouncerBinary()
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(cfg.Target)
	if err != nil {
		return nil, fmt.Errorf("e2e: pgbouncer target %q: %w", cfg.Target, err)
	}
	if cfg.PoolSize <= 0 {
		cfg.PoolSize = 4
	}
	if cfg.MaxClientConn <= 0 {
		cfg.MaxClientConn = 400
	}
	dir, err := tempDirFor("e2e-pgbouncer-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // a port taken between choosing and binding it: another one
		p, err := FreePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		b, err := startPgBouncer(ctx, bin, dir, host, port, p, cfg)
		if err == nil {
			return b, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func startPgBouncer(ctx context.Context, bin, dir, host, port string, listen int, cfg PgBouncerConfig) (*PgBouncer, error) {
	roundRobin := 0
	if cfg.RoundRobin {
		roundRobin = 1
	}
	ini := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("* = host=%s port=%s", host, port),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(listen),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "userlist.txt"),
		"pool_mode = transaction",
		"default_pool_size = " + strconv.Itoa(cfg.PoolSize),
		"max_client_conn = " + strconv.Itoa(cfg.MaxClientConn),
		"server_round_robin = " + strconv.Itoa(roundRobin),
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
		"",
	}, "\n")
	for name, data := range map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  "\"postgres\" \"\"\n",
	} {
		// #nosec G306 -- a test's configuration, read by the postgres user
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return nil, err
		}
	}
	cmd := commandAs(context.WithoutCancel(ctx), bin, filepath.Join(dir, "pgbouncer.ini"))
	// A process group of its own: runuser forks PgBouncer, and stop ends
	// both.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("e2e: starting pgbouncer: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b := &PgBouncer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(listen)), dir: dir, cmd: cmd}
	dsn := "postgres://postgres@" + b.Addr + "/postgres?sslmode=disable"
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("e2e: pgbouncer exited: %v: %s", err, b.LogTail(10))
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		if err == nil {
			_, err = conn.Exec(cctx, "SELECT 1")
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return b, nil
		}
		if time.Now().After(deadline) {
			b.stop()
			return nil, fmt.Errorf("e2e: pgbouncer on %s not ready after 15s: %w: %s", b.Addr, err, b.LogTail(10))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// DSN is dsn (a postgres:// URL) with its server reached through PgBouncer.
func (b *PgBouncer) DSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	u.Host = b.Addr
	return u.String()
}

// LogTail is the last n lines of PgBouncer's log.
func (b *PgBouncer) LogTail(n int) string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Log is PgBouncer's whole log.
func (b *PgBouncer) Log() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	return string(data)
}

func (b *PgBouncer) stop() {
	if b.cmd.Process != nil {
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// Close stops PgBouncer and removes its directory.
func (b *PgBouncer) Close() {
	b.stop()
	_ = os.RemoveAll(b.dir)
}
