package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// payload is a Stripe event body split around its event ID, so a delivery
// with any ID is one append.
type payload struct {
	prefix, suffix []byte
}

// loadPayload reads a Stripe event and splits it at the value of its first
// "id" key (the event's own ID).
func loadPayload(path string) (payload, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return payload{}, err
	}
	const key = `"id": "`
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return payload{}, fmt.Errorf("%s: no %q", path, key)
	}
	j := bytes.IndexByte(b[i+len(key):], '"')
	if j < 0 {
		return payload{}, fmt.Errorf("%s: unterminated id", path)
	}
	return payload{prefix: b[:i+len(key)], suffix: b[i+len(key)+j:]}, nil
}

// paddedPayload is a JSON event of exactly size bytes (for a 24-byte ID).
func paddedPayload(size int) payload {
	const head, mid, tail = `{"id":"`, `","object":"event","data":"`, `"}`
	pad := size - len(head) - 24 - len(mid) - len(tail)
	if pad < 0 {
		pad = 0
	}
	return payload{prefix: []byte(head), suffix: []byte(mid + strings.Repeat("x", pad) + tail)}
}

func (p payload) body(id string) []byte {
	b := make([]byte, 0, len(p.prefix)+len(id)+len(p.suffix))
	b = append(b, p.prefix...)
	b = append(b, id...)
	return append(b, p.suffix...)
}

// ids hands out event IDs unique to this process run: "evt_" + 8 random
// hex digits + a counter, 24 bytes like Stripe's.
type ids struct {
	run string
	n   atomic.Uint64
}

func newIDs() *ids {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &ids{run: hex.EncodeToString(b)}
}

func (g *ids) next() string {
	return fmt.Sprintf("evt_%s%012d", g.run, g.n.Add(1))
}

// signer signs a body the way Stripe does: Stripe-Signature:
// t=<unix>,v1=<hex HMAC-SHA256 of "t.body">.
type signer struct{ key []byte }

func (s signer) sign(body []byte) string {
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// targeter returns signed deliveries to url. With fixed nil every delivery
// carries a fresh event ID; otherwise the IDs of fixed are redelivered in
// turn, forever when loop, else once each (then vegeta.ErrNoTargets).
func targeter(url string, p payload, g *ids, fixed []string, loop bool) vegeta.Targeter {
	s := signer{key: []byte(secret)}
	var n atomic.Uint64
	return func(t *vegeta.Target) error {
		var id string
		if fixed == nil {
			id = g.next()
		} else {
			i := n.Add(1) - 1
			if !loop && i >= uint64(len(fixed)) {
				return vegeta.ErrNoTargets
			}
			id = fixed[i%uint64(len(fixed))]
		}
		body := p.body(id)
		t.Method = http.MethodPost
		t.URL = url
		t.Body = body
		t.Header = http.Header{
			"Content-Type":     {"application/json; charset=utf-8"},
			"Stripe-Signature": {s.sign(body)},
		}
		return nil
	}
}
