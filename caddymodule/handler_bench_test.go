package caddymodule

import (
	"bytes"
	"net/http"
	"testing"
	"time"
)

// rewindBody is a request body that can be replayed without allocating, so
// the benchmark counts only the handler's allocations.
type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

// discardWriter is a ResponseWriter whose header map is reused.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }

// SetReadDeadline succeeds, as net/http's writer does: read_timeout's
// deadline is set through http.ResponseController, whose error for a
// writer without deadlines would be allocated on every request here and
// never in a server.
func (w *discardWriter) SetReadDeadline(time.Time) error { return nil }

// BenchmarkServeHTTPDuplicateCached is the redelivery of a completed event
// whose completion is in the in-memory cache: verify, extract the ID, answer
// 200 at the edge, log the delivery. The store is never asked and next is
// never called. The logger is Caddy's default (info, JSON) into io.Discard,
// so the log line's encoding is counted but not the terminal.
func BenchmarkServeHTTPDuplicateCached(b *testing.B) { benchRedelivery(b, "short", true) }

// TestDuplicateCachedAllocations: a cached duplicate, on a request that
// carries Caddy's replacer as a server's does, allocates at most twice
// beyond its body: the event ID's copy (it outlives the pooled body) and
// the answer's header values (writeFixed). The placeholders' values are
// strings in interfaces (Caddy's expression matchers accept only native
// values), made once: the scope's per handler, the event ID's when the
// cache learned the event (cache.Entry.ID).
func TestDuplicateCachedAllocations(t *testing.T) {
	if raceEnabled() {
		t.Skip("allocation counts differ under -race")
	}
	res := testing.Benchmark(BenchmarkServeHTTPDuplicateCached)
	if res.N == 0 {
		t.Fatal("the benchmark did not run")
	}
	if a := res.AllocsPerOp(); a > 2 {
		t.Fatalf("a cached duplicate allocates %d times per request, want at most 2", a)
	}
}
