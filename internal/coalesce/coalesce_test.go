package coalesce

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// gated is a write function that records each batch and, for the batches
// named in block, waits until the test opens the gate.
type gated struct {
	mu      sync.Mutex
	batches [][]int
	entered chan struct{} // a blocked write has started
	gate    chan struct{}
	block   map[int]bool // by batch number, from 0
	err     error
}

func newGated(block ...int) *gated {
	g := &gated{entered: make(chan struct{}, 16), gate: make(chan struct{}), block: map[int]bool{}}
	for _, n := range block {
		g.block[n] = true
	}
	return g
}

func (g *gated) write(_ context.Context, batch []*int) error {
	g.mu.Lock()
	n := len(g.batches)
	vs := make([]int, len(batch))
	for i, v := range batch {
		vs[i] = *v
		*v = -*v // the result: filled in by the writer
	}
	g.batches = append(g.batches, vs)
	err := g.err
	g.mu.Unlock()
	if g.block[n] {
		g.entered <- struct{}{}
		<-g.gate
	}
	return err
}

func (g *gated) sizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]int, len(g.batches))
	for i, b := range g.batches {
		out[i] = len(b)
	}
	return out
}

// queued waits until n operations are queued behind the writer.
func queued[T any](t *testing.T, c *Coalescer[T], n int) {
	t.Helper()
	for range 1_000_000 {
		if c.Queued() == n {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("%d operations never queued", n)
}

func TestLoneOperation(t *testing.T) {
	t.Parallel()
	g := newGated()
	c := New(Options{}, g.write)
	v := 7
	require.NoError(t, c.Do(t.Context(), &v))
	require.Equal(t, -7, v, "the writer filled in the result")
	require.Equal(t, []int{1}, g.sizes())
}

// Operations that arrive while a batch is written wait for the next one,
// in batches of at most MaxBatch; each caller gets its own result.
func TestNaturalBatching(t *testing.T) {
	t.Parallel()
	g := newGated(0)
	c := New(Options{MaxBatch: 4}, g.write)
	first := 100
	done := make(chan error, 11)
	go func() { done <- c.Do(t.Context(), &first) }()
	<-g.entered
	vals := make([]int, 10)
	for i := range vals {
		vals[i] = i + 1
		go func() { done <- c.Do(t.Context(), &vals[i]) }()
	}
	queued(t, c, 10)
	close(g.gate)
	for range 11 {
		require.NoError(t, <-done)
	}
	require.Equal(t, []int{1, 4, 4, 2}, g.sizes())
	require.Equal(t, -100, first)
	for i, v := range vals {
		require.Equal(t, -(i + 1), v)
	}
}

func TestBatchErrorFailsEveryOperation(t *testing.T) {
	t.Parallel()
	g := newGated(0)
	g.err = errors.New("disk on fire")
	c := New(Options{}, g.write)
	done := make(chan error, 3)
	vals := []int{1, 2, 3}
	go func() { done <- c.Do(t.Context(), &vals[0]) }()
	<-g.entered
	go func() { done <- c.Do(t.Context(), &vals[1]) }()
	go func() { done <- c.Do(t.Context(), &vals[2]) }()
	queued(t, c, 2)
	close(g.gate)
	for range 3 {
		require.ErrorIs(t, <-done, g.err)
	}
	require.Equal(t, []int{1, 2}, g.sizes())
}

// An operation whose caller gave up before its batch was taken is left out
// of the write and answered with its context's error.
func TestGivenUpLeftOut(t *testing.T) {
	t.Parallel()
	g := newGated(0)
	c := New(Options{}, g.write)
	done := make(chan error, 3)
	vals := []int{1, 2, 3}
	go func() { done <- c.Do(t.Context(), &vals[0]) }()
	<-g.entered
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- c.Do(ctx, &vals[1]) }()
	go func() { done <- c.Do(t.Context(), &vals[2]) }()
	queued(t, c, 2)
	require.ErrorIs(t, <-gaveUp, context.Canceled)
	close(g.gate)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	require.Equal(t, []int{1, 1}, g.sizes())
	require.Equal(t, 2, vals[1], "never written")
}

// Close fails what is queued, waits for the batch being written, and
// refuses what comes after.
func TestClose(t *testing.T) {
	t.Parallel()
	g := newGated(0)
	c := New(Options{}, g.write)
	closed := errors.New("closed")
	vals := []int{1, 2, 3}
	first := make(chan error, 1)
	go func() { first <- c.Do(t.Context(), &vals[0]) }()
	<-g.entered
	queuedErr := make(chan error, 2)
	go func() { queuedErr <- c.Do(t.Context(), &vals[1]) }()
	go func() { queuedErr <- c.Do(t.Context(), &vals[2]) }()
	queued(t, c, 2)
	closeDone := make(chan struct{})
	go func() {
		c.Close(closed)
		close(closeDone)
	}()
	require.ErrorIs(t, <-queuedErr, closed)
	require.ErrorIs(t, <-queuedErr, closed)
	select {
	case <-closeDone:
		t.Fatal("Close returned while a batch was being written")
	default:
	}
	close(g.gate)
	<-closeDone
	require.NoError(t, <-first)
	v := 4
	require.ErrorIs(t, c.Do(t.Context(), &v), closed)
	require.Equal(t, []int{1}, g.sizes())
}
