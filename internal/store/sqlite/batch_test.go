package sqlite_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/sqlite"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store/storetest"
)

func TestConformanceUnbatched(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, sqlite.Options{Batch: store.BatchOptions{Disabled: true}})
	})
}

// childEnv names the database file of the killed-process test's child.
const childEnv = "WEBHOOK_IDEMPOTENCY_SQLITE_KILL_CHILD"

// TestKilledMidBatch kills -9 a process that claims and completes fresh
// event IDs from 16 goroutines through batches, then reopens its file:
// every claim the process acknowledged as Claimed is in the table
// (processing or completed) and every completion it acknowledged is
// completed. A commit survives the process (the WAL is fsynced at commit,
// synchronous FULL), so a kill costs at most the claims then in flight,
// whose leases expire and whose deliveries are forwarded again: never a
// lost event.
func TestKilledMidBatch(t *testing.T) {
	if path := os.Getenv(childEnv); path != "" {
		killChild(path)
		return
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "events.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledMidBatch$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())

	var (
		claimed   = map[string]bool{}
		completed = map[string]bool{}
		lines     = bufio.NewScanner(out)
		killed    bool
	)
	for lines.Scan() {
		op, id, ok := strings.Cut(lines.Text(), " ")
		if !ok {
			continue
		}
		switch op {
		case "claimed":
			claimed[id] = true
		case "completed":
			completed[id] = true
		}
		if !killed && len(completed) >= 500 {
			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			killed = true
		}
	}
	err = cmd.Wait()
	require.True(t, killed, "the child ended before it was killed: %v", err)
	require.Error(t, err)

	s := newStore(t, sqlite.Options{Path: path})
	evs, err := s.List(t.Context(), store.ListQuery{Limit: 1000})
	require.NoError(t, err)
	rows := map[string]store.State{}
	for len(evs) > 0 {
		for _, ev := range evs {
			rows[ev.EventID] = ev.State
		}
		evs, err = s.List(t.Context(), store.ListQuery{Limit: 1000,
			AfterUpdatedAt: evs[len(evs)-1].UpdatedAt, AfterScope: evs[len(evs)-1].Scope, AfterID: evs[len(evs)-1].EventID})
		require.NoError(t, err)
	}
	for id := range claimed {
		state, ok := rows[id]
		require.True(t, ok, "claim of %s acknowledged, missing after the kill", id)
		require.Contains(t, []store.State{store.StateProcessing, store.StateCompleted}, state, id)
	}
	for id := range completed {
		require.Equal(t, store.StateCompleted, rows[id], "completion of %s acknowledged, lost after the kill", id)
	}
	inFlight := 0
	for _, state := range rows {
		if state == store.StateProcessing {
			inFlight++
		}
	}
	t.Logf("killed after %d acknowledged claims, %d completions; %d rows, %d left processing (forwarded again after their lease)",
		len(claimed), len(completed), len(rows), inFlight)
}

// killChild is the killed process: it claims and completes fresh IDs until
// it is killed, printing each acknowledged claim and completion.
func killChild(path string) {
	s, err := sqlite.New(context.Background(), sqlite.Options{Path: path})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var (
		mu sync.Mutex
		w  = bufio.NewWriter(os.Stdout)
	)
	say := func(op, id string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(w, op, id)
		_ = w.Flush()
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for n := 0; ; n++ {
				id := fmt.Sprintf("evt_%d_%d", g, n)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := s.Claim(ctx, store.ClaimParams{Scope: "stripe", EventID: id, Lease: time.Minute})
				if err != nil || c.Outcome != store.Claimed {
					cancel()
					fmt.Fprintln(os.Stderr, "claim", id, c.Outcome, err)
					os.Exit(2)
				}
				say("claimed", id)
				err = s.Complete(ctx, "stripe", id, c.Token, 200)
				cancel()
				if err != nil {
					fmt.Fprintln(os.Stderr, "complete", id, err)
					os.Exit(2)
				}
				say("completed", id)
			}
		})
	}
	wg.Wait()
}
