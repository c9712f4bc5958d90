package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// GatewayConfig describes one Caddy process: one site on 127.0.0.1 with a
// webhook_idempotency block in front of reverse_proxy.
type GatewayConfig struct {
	// Binary is the custom Caddy built by BuildCaddy.
	Binary string
	// Dir holds the instance's Caddyfile, log and data directories.
	Dir string
	// Name names the instance's files; it must be unique within Dir.
	Name string
	// Upstream is the reverse_proxy target, host:port.
	Upstream string
	// Handler holds the lines of the webhook_idempotency block.
	Handler []string
	// GitHub, when set, holds the lines of a second webhook_idempotency
	// block, for the requests to /webhooks/github (Gateway.GitHubURL),
	// in front of the same upstream: two routes of one process.
	GitHub []string
	// LogLevel is the default logger's level; "" leaves Caddy's (INFO, one
	// line per delivery).
	LogLevel string
	// Admin turns Caddy's admin endpoint on, on a free port of 127.0.0.1
	// (Gateway.AdminAddr): the webhook_idempotency admin API and /metrics.
	Admin bool
	// Debug sets Caddy's global debug option: every forward logs
	// reverse_proxy's "upstream roundtrip" line with the request's headers.
	Debug bool
	// NoLogFilter leaves out the logging configuration the README ships
	// (the output of `caddy webhook-idempotency log-filter --provider
	// stripe`), which removes the signature headers from Caddy's own log
	// lines. Only a test that shows the leak it prevents sets it.
	NoLogFilter bool
}

// Gateway is a running Caddy process, in a process group of its own.
type Gateway struct {
	// Name is GatewayConfig.Name.
	Name string
	// Addr is the 127.0.0.1:port the site listens on.
	Addr string
	// AdminAddr is the admin endpoint's 127.0.0.1:port ("" when off).
	AdminAddr string

	cmd     *exec.Cmd
	home    string // its HOME, with XDG_DATA_HOME in home/data
	logPath string
	exited  chan struct{}
	waitErr error
}

// StartGateway writes the Caddyfile, starts Caddy and waits (at most 30s)
// until it accepts connections. A port taken between choosing and binding
// it is retried on another port.
func StartGateway(cfg GatewayConfig) (*Gateway, error) {
	var lastErr error
	for range 3 {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		g, err := startGateway(cfg, port)
		if err == nil {
			return g, nil
		}
		lastErr = err
		if g == nil || !strings.Contains(g.LogTail(50), "address already in use") {
			break
		}
	}
	return nil, lastErr
}

func startGateway(cfg GatewayConfig, port int) (*Gateway, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	home := filepath.Join(cfg.Dir, cfg.Name+"-home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, err
	}
	adminAddr := ""
	if cfg.Admin {
		aport, err := FreePort()
		if err != nil {
			return nil, err
		}
		adminAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(aport))
	}
	filter := ""
	if !cfg.NoLogFilter {
		var err error
		if filter, err = logFilter(cfg.Binary); err != nil {
			return nil, err
		}
	}
	caddyfile := filepath.Join(cfg.Dir, cfg.Name+".Caddyfile")
	if err := os.WriteFile(caddyfile, []byte(cfg.caddyfile(addr, adminAddr, filter)), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(cfg.Dir, cfg.Name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== start %s on %s\n", time.Now().Format(time.RFC3339Nano), addr)

	cmd := exec.Command(cfg.Binary, "run", "--config", caddyfile, "--adapter", "caddyfile")
	cmd.Dir = cfg.Dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(),
		"HOME="+home, "XDG_DATA_HOME="+filepath.Join(home, "data"), "XDG_CONFIG_HOME="+filepath.Join(home, "config"))
	// Own process group, so Kill reaches everything it started; and killed
	// with the test process if that dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("e2e: starting caddy %s: %w", cfg.Name, err)
	}
	g := &Gateway{Name: cfg.Name, Addr: addr, AdminAddr: adminAddr, cmd: cmd, home: home, logPath: logPath, exited: make(chan struct{})}
	go func() {
		g.waitErr = cmd.Wait()
		close(g.exited)
	}()

	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-g.exited:
			return g, fmt.Errorf("e2e: caddy %s exited while starting (%v); log:\n%s", cfg.Name, g.waitErr, g.LogTail(30))
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return g, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	g.Kill()
	return g, fmt.Errorf("e2e: caddy %s did not listen on %s within 30s; log:\n%s", cfg.Name, addr, g.LogTail(30))
}

// logFilter asks the binary for the site form of the logging configuration
// the README ships (log-filter --site) and returns the lines inside its log
// block: the filter encoder that deletes Stripe's signature header.
func logFilter(binary string) (string, error) {
	out, err := exec.Command(binary, "webhook-idempotency", "log-filter", "--site", "--provider", "stripe").Output()
	if err != nil {
		return "", fmt.Errorf("e2e: caddy webhook-idempotency log-filter: %w", err)
	}
	s := strings.TrimSpace(string(out))
	inner, ok := strings.CutPrefix(s, "log {\n")
	inner, ok2 := strings.CutSuffix(inner, "\n}")
	if !ok || !ok2 || !strings.Contains(inner, "request>headers>Stripe-Signature delete") {
		return "", fmt.Errorf("e2e: unexpected log-filter output:\n%s", out)
	}
	return inner + "\n", nil
}

// caddyfile renders the instance's whole Caddyfile; adminAddr "" turns
// the admin endpoint off; filter is the body of the default log's block
// that removes signature headers ("" for none).
func (cfg GatewayConfig) caddyfile(addr, adminAddr, filter string) string {
	var b strings.Builder
	admin := "off"
	if adminAddr != "" {
		admin = adminAddr
	}
	b.WriteString("{\n\tadmin " + admin + "\n\tauto_https off\n\tpersist_config off\n\tgrace_period 1s\n")
	if cfg.Debug {
		b.WriteString("\tdebug\n")
	}
	if cfg.LogLevel != "" || filter != "" {
		b.WriteString("\tlog default {\n")
		if cfg.LogLevel != "" {
			fmt.Fprintf(&b, "\t\tlevel %s\n", cfg.LogLevel)
		}
		for _, l := range strings.SplitAfter(filter, "\n") {
			if l != "" {
				b.WriteString("\t" + l)
			}
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n\n")
	fmt.Fprintf(&b, "http://%s {\n\tbind 127.0.0.1\n", addr)
	route := func(indent string, lines []string) {
		b.WriteString(indent + "webhook_idempotency {\n")
		for _, l := range lines {
			b.WriteString(indent + "\t" + l + "\n")
		}
		fmt.Fprintf(&b, "%s}\n%sreverse_proxy %s\n", indent, indent, cfg.Upstream)
	}
	if cfg.GitHub != nil {
		b.WriteString("\thandle /webhooks/github {\n")
		route("\t\t", cfg.GitHub)
		b.WriteString("\t}\n\thandle {\n")
		route("\t\t", cfg.Handler)
		b.WriteString("\t}\n")
	} else {
		route("\t", cfg.Handler)
	}
	b.WriteString("}\n")
	return b.String()
}

// URL is the address deliveries are posted to.
func (g *Gateway) URL() string { return "http://" + g.Addr + "/webhooks/stripe" }

// GitHubURL is the address of the GitHub route (GatewayConfig.GitHub).
func (g *Gateway) GitHubURL() string { return "http://" + g.Addr + "/webhooks/github" }

// SpoolDir is the default spool directory of scope in the gateway's Caddy
// data directory. A gateway started again with the same Name uses it again.
func (g *Gateway) SpoolDir(scope string) string {
	return filepath.Join(g.home, "data", "caddy", "webhook_idempotency", "spool", scope)
}

// PID is the process ID of Caddy.
func (g *Gateway) PID() int { return g.cmd.Process.Pid }

// Kill sends SIGKILL to the gateway's process group and waits for the
// process to be reaped. Safe to call more than once.
func (g *Gateway) Kill() {
	select {
	case <-g.exited:
		return
	default:
	}
	_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
	<-g.exited
}

// Terminate sends SIGTERM to Caddy, as a rolling deploy does, and waits
// at most limit for the process to exit; it reports whether it did.
func (g *Gateway) Terminate(limit time.Duration) bool {
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
		return true
	case <-time.After(limit):
		return false
	}
}

// Exited reports whether the process has ended.
func (g *Gateway) Exited() bool {
	select {
	case <-g.exited:
		return true
	default:
		return false
	}
}

// RSS reads the resident set size of the process, in bytes, from
// /proc/<pid>/status (VmRSS).
func (g *Gateway) RSS() (int64, error) {
	return ProcessRSS(g.PID())
}

// OpenFiles counts the process's open file descriptors (sockets included),
// from /proc/<pid>/fd.
func (g *Gateway) OpenFiles() (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", g.PID()))
	return len(entries), err
}

// ProcessRSS reads VmRSS of a process from /proc/<pid>/status, in bytes.
func ProcessRSS(pid int) (int64, error) {
	rss, _, err := ProcessMemory(pid)
	return rss, err
}

// ProcessMemory reads VmRSS (resident now) and VmHWM (the kernel's own peak
// of it) of a process from /proc/<pid>/status, in bytes.
func ProcessMemory(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	seen := 0
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		fields := strings.Fields(rest) // "123456 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, 0, fmt.Errorf("e2e: unexpected %s line %q", name, sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, 0, err
		}
		if name == "VmRSS" {
			rss = kb * 1024
		} else {
			hwm = kb * 1024
		}
		seen++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if seen < 2 {
		return 0, 0, errors.New("e2e: no VmRSS or VmHWM in /proc status")
	}
	return rss, hwm, nil
}

// LogTail returns the last n lines of the gateway's log.
func (g *Gateway) LogTail(n int) string {
	b, err := os.ReadFile(g.logPath)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
