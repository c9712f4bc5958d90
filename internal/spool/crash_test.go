package spool_test

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

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/spool"
)

// A record torn by a crash at the end of the last segment (cut anywhere in
// its frame, or with bytes that are not a frame) is dropped on Open and
// cut off the file; the records before it are kept, and appends after the
// recovery are recovered by the next Open too. A torn ack entry is
// ignored: its record is delivered again (and found completed by its
// claim, see TestNeverForwardsAnEventClaimedElsewhere).
func TestTornTailIsDropped(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		tear func(t *testing.T, path string, lastOff, size int64)
	}{
		{"cut in the frame header", func(t *testing.T, path string, lastOff, _ int64) {
			require.NoError(t, os.Truncate(path, lastOff+3))
		}},
		{"cut in the payload", func(t *testing.T, path string, lastOff, size int64) {
			require.NoError(t, os.Truncate(path, lastOff+size-5))
		}},
		{"payload bytes never written", func(t *testing.T, path string, lastOff, size int64) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			_, err = f.WriteAt(make([]byte, 10), lastOff+size-10) // zeros: a length but no data
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{"garbage after the last record", func(t *testing.T, path string, _, _ int64) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.Write([]byte{0, 0, 0, 9, 1, 2})
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			appendAll(t, b.sp, "a", "b")
			before := b.sp.Stats().Bytes
			appendAll(t, b.sp, "c")
			size := b.sp.Stats().Bytes - before
			require.NoError(t, b.sp.Close())
			segs := segmentFiles(t, b.dir)
			require.Len(t, segs, 1)
			path := segs[0]
			if tc.name == "garbage after the last record" {
				before += size // c is whole; the garbage is the torn part
			}
			tc.tear(t, path, before, size)

			b.sp = nil
			b.reopen(t)
			st := b.sp.Stats()
			want := []string{"a", "b"}
			if tc.name == "garbage after the last record" {
				want = []string{"a", "b", "c"}
			}
			require.Equal(t, want, ids(b.sp.List(10)))
			require.EqualValues(t, 1, st.Counts.Torn)
			fi, err := os.Stat(path)
			require.NoError(t, err)
			require.Equal(t, before, fi.Size(), "the torn bytes are cut off")

			appendAll(t, b.sp, "d")
			b.reopen(t)
			require.Equal(t, append(want, "d"), ids(b.sp.List(10)))
			require.Zero(t, b.sp.Stats().Counts.Torn)
		})
	}
}

// A torn ack entry (a crash while acknowledging) is ignored: the record
// waits again after the restart.
func TestTornAckIsIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	appendAll(t, b.sp, "a", "b", "c")
	var mu sync.Mutex
	n := 0
	detach := b.sp.Attach(func(context.Context, *spool.Record) spool.Result {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n > 2 {
			return spool.Result{Outcome: spool.Unavailable}
		}
		return spool.Result{Outcome: spool.Forwarded}
	})
	waitFor(t, 5*time.Second, "two acknowledged", func() bool { return b.sp.Stats().Records == 1 })
	detach()
	require.NoError(t, b.sp.Close())
	acks, err := filepath.Glob(filepath.Join(b.dir, "seg-*.ack"))
	require.NoError(t, err)
	require.Len(t, acks, 1)
	fi, err := os.Stat(acks[0])
	require.NoError(t, err)
	require.NoError(t, os.Truncate(acks[0], fi.Size()-3)) // b's entry torn
	b.sp = nil
	b.reopen(t)
	require.Equal(t, []string{"b", "c"}, ids(b.sp.List(10)))
}

// crashEnv names the spool directory of the helper process of
// TestKill9KeepsEveryAcknowledgedRecord.
const crashEnv = "SPOOL_CRASH_HELPER_DIR"

// TestCrashHelper is the process that is killed: it appends records from
// four goroutines and prints each event ID once its Append returned (the
// moment a gateway answers the provider 2xx). It runs only as the helper.
func TestCrashHelper(t *testing.T) {
	dir := os.Getenv(crashEnv)
	if dir == "" {
		t.Skip("helper process of TestKill9KeepsEveryAcknowledgedRecord")
	}
	sp, err := spool.Open(spool.Options{Dir: dir, SegmentBytes: 16 << 10})
	if err != nil {
		fmt.Println("open failed:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				r := record(fmt.Sprintf("%d-%d-%d", os.Getpid(), g, i))
				r.Body = make([]byte, 300+i%700) // records of varied sizes
				if err := sp.Append(context.Background(), r); err != nil {
					fmt.Println("append failed:", err)
					os.Exit(2)
				}
				mu.Lock()
				fmt.Fprintln(out, "acked", r.EventID)
				_ = out.Flush()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// kill -9 in the middle of appends, three times over one directory: every
// record whose Append returned before the kill is there after the next
// Open (recovered in order, torn tails cut), and the next process can take
// the directory's lock at once.
func TestKill9KeepsEveryAcknowledgedRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills processes")
	}
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "spool")
	acked := map[string]bool{}
	for round := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnv+"="+dir)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stdout)
		n := 0
		for sc.Scan() {
			line := sc.Text()
			id, ok := strings.CutPrefix(line, "acked ")
			require.True(t, ok, "helper: %s", line)
			acked[id] = true
			n++
			if n == 150+round*50 {
				require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
				break
			}
		}
		for sc.Scan() { // lines printed before the kill landed
			if id, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
				acked[id] = true
			}
		}
		_ = cmd.Wait()
		cancel()

		sp, err := spool.Open(spool.Options{Dir: dir})
		require.NoError(t, err, "round %d", round)
		found := map[string]bool{}
		l := sp.List(1 << 20)
		for i, e := range l {
			found[e.EventID] = true
			if i > 0 {
				require.Greater(t, e.Seq, l[i-1].Seq)
			}
		}
		for id := range acked {
			require.True(t, found[id], "round %d: acknowledged record %s lost", round, id)
		}
		require.Equal(t, len(l), sp.Stats().Records)
		t.Logf("round %d: %d acknowledged so far, %d in the spool, %d torn record(s) dropped",
			round, len(acked), len(l), sp.Stats().Counts.Torn)
		require.NoError(t, sp.Close())
	}
}
