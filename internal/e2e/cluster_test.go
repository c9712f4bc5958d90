package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"time"
)

// Cluster is the local PostgreSQL cluster serving a DSN, controlled with
// pg_ctlcluster (Debian's postgresql-common).
type Cluster struct {
	Version, Name string
}

// LocalCluster finds, with pg_lsclusters, the local cluster listening on the
// DSN's port.
func LocalCluster(dsn string) (Cluster, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return Cluster{}, err
	}
	if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" && h != "" {
		return Cluster{}, fmt.Errorf("e2e: %s is not a local server", h)
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	out, err := exec.Command("pg_lsclusters", "-h").Output()
	if err != nil {
		return Cluster{}, fmt.Errorf("e2e: pg_lsclusters: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line) // version name port status owner datadir logfile
		if len(f) >= 3 && f[2] == port {
			return Cluster{Version: f[0], Name: f[1]}, nil
		}
	}
	return Cluster{}, fmt.Errorf("e2e: no local cluster on port %s", port)
}

func (c Cluster) ctl(ctx context.Context, action string) error {
	cmd := exec.CommandContext(ctx, "pg_ctlcluster", "--skip-systemctl-redirect", c.Version, c.Name, action)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("e2e: pg_ctlcluster %s %s %s: %w: %s", c.Version, c.Name, action, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Stop stops the cluster (fast shutdown: sessions are terminated).
func (c Cluster) Stop(ctx context.Context) error { return c.ctl(ctx, "stop") }

// Start starts the cluster and waits until dsn accepts a login (at most
// 60s). Starting a running cluster is not an error.
func (c Cluster) Start(ctx context.Context, dsn string) error {
	if err := c.ctl(ctx, "start"); err != nil && !strings.Contains(err.Error(), "already running") {
		return err
	}
	return WaitReady(ctx, dsn, 60*time.Second)
}

// String names the cluster the way pg_lsclusters does.
func (c Cluster) String() string { return c.Version + "/" + c.Name }
