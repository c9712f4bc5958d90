package caddymodule

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/keyfetch/keyfetchtest"
)

// TestMain holds an exclusive lock on a file of the machine's temporary
// directory while the package's tests run. The in-process Caddy tests
// (caddytest) listen on fixed ports (admin 2999, http 9080, https 9443)
// and load a global config: two test binaries of this package running at
// once, from two checkouts, would load their configs into each other's
// servers. The lock makes the second wait. It also starts the local key
// server of the presets verified with the provider's keys (keys).
//
// A fuzzing run's workers are processes of the same binary started by its
// coordinator, which holds the lock: they must not wait for it.
func TestMain(m *testing.M) {
	flag.Parse()
	path := filepath.Join(os.TempDir(), "caddy-webhook-idempotency-caddytest.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600) //nolint:gosec // a lock file of the tests
	if err != nil {
		fmt.Fprintln(os.Stderr, "caddymodule tests: lock file:", err)
		os.Exit(1)
	}
	if w := flag.Lookup("test.fuzzworker"); w == nil || w.Value.String() != "true" {
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil { //nolint:gosec // a file descriptor fits an int
			fmt.Fprintln(os.Stderr, "caddymodule tests: lock:", err)
			os.Exit(1)
		}
	}
	// Caddy's data directory of its own: the default SQLite store and the
	// default spools (on for github routes) must not carry a run's
	// records into the next one, or into the user's Caddy.
	data, err := os.MkdirTemp("", "caddymodule-data-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "caddymodule tests: data directory:", err)
		os.Exit(1)
	}
	_ = os.Setenv("XDG_DATA_HOME", data)
	keys = keyfetchtest.Start()
	code := m.Run()
	keys.Close()
	_ = os.RemoveAll(data)
	_ = f.Close() // releases the lock
	os.Exit(code)
}
