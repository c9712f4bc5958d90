package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// Every signature Deliver sends is recorded, so a gateway's log can be
// searched for it after the test: no secret and no signature value may
// reach any log line at any level, from any logger (the handler's, or
// Caddy's own: reverse_proxy, http.log.error, access logs).
var sent = struct {
	sync.Mutex
	sigs map[string]bool // the hex digests (v1=...) of Stripe-Signature values sent
}{sigs: map[string]bool{}}

// recordSignature notes the digest of a Stripe-Signature header sent.
func recordSignature(header string) {
	for _, part := range strings.Split(header, ",") {
		if v, ok := strings.CutPrefix(part, "v1="); ok {
			sent.Lock()
			sent.sigs[v] = true
			sent.Unlock()
		}
	}
}

// digest finds the candidates: HMAC-SHA256 digests in hex.
var digest = regexp.MustCompile(`[0-9a-f]{64}`)

// FindLeaks returns every line of the log at path (a gateway's stdout and
// stderr) that holds one of secrets or a signature digest Deliver sent,
// each shortened to what is needed to find it. Empty secrets are ignored.
func FindLeaks(path string, secrets ...string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var leaks []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		what, at := "", -1
		for _, s := range secrets {
			if i := bytes.Index(line, []byte(s)); s != "" && i >= 0 {
				what, at = "a configured secret", i
				break
			}
		}
		if what == "" {
			sent.Lock()
			for _, loc := range digest.FindAllIndex(line, -1) {
				if sent.sigs[string(line[loc[0]:loc[1]])] {
					what, at = "a signature sent", loc[0]
					break
				}
			}
			sent.Unlock()
		}
		if what != "" {
			// The line's start (level, logger, message) and where the
			// value sits (the field that printed it).
			leaks = append(leaks, fmt.Sprintf("line %d holds %s: %.160s ... %s", n, what, line, line[max(0, at-60):at]))
		}
	}
	return leaks, sc.Err()
}

// CheckNoLeaks fails t when the log at path holds a secret or a signature
// sent (FindLeaks). The e2e harness runs it on every gateway's log when the
// gateway is torn down.
func CheckNoLeaks(t testing.TB, path string, secrets ...string) {
	t.Helper()
	leaks, err := FindLeaks(path, secrets...)
	if err != nil {
		t.Errorf("e2e: reading %s for leaks: %v", path, err)
		return
	}
	for _, l := range leaks {
		t.Errorf("e2e: secret in the log %s: %s", path, l)
	}
}
