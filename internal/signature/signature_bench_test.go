package signature_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// benchBody returns a JSON object of exactly size bytes, shaped like an
// event envelope (some schemes refuse a body that is not a JSON object).
func benchBody(size int) []byte {
	const head, tail = `{"id":"evt_1NbenchAAAAAAAAAAAAAAAA","object":"event","data":"`, `"}`
	return []byte(head + strings.Repeat("x", size-len(head)-len(tail)) + tail)
}

// BenchmarkVerify measures one verification of a correctly signed delivery:
// header parsing, the timestamp check and one HMAC over the body (the work
// grows with the body; the fixed part is what a small body shows).
func BenchmarkVerify(b *testing.B) {
	schemes := []struct {
		provider string
		opts     signature.Options
		headers  http.Header
	}{
		{"stripe", signature.Options{Secrets: []string{"whsec_bench"}}, http.Header{}},
		{"github", signature.Options{Secrets: []string{"bench-secret"}}, http.Header{}},
		{"standard", signature.Options{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}},
			http.Header{"Webhook-Id": {"msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"}}},
		{"hmac", signature.Options{Secrets: []string{"bench-secret"}, HMAC: signature.HMACOptions{
			Header: "X-Webhook-Signature", Algorithm: "sha256", Encoding: "hex", Prefix: "sha256=",
		}}, http.Header{}},
	}
	at := time.Unix(1_764_547_200, 0)
	for _, s := range schemes {
		for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", s.provider, size>>10), func(b *testing.B) {
				o := s.opts
				o.Now = func() time.Time { return at }
				body := benchBody(size)
				h := s.headers.Clone()
				if err := signature.Sign(s.provider, o, body, h, at); err != nil {
					b.Fatal(err)
				}
				v, err := signature.New(s.provider, o)
				if err != nil {
					b.Fatal(err)
				}
				if err := v.Verify(body, h); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if err := v.Verify(body, h); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
