package signature

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// hmac is the user-described scheme: an HMAC of the raw body in one header,
// configured by Options.HMAC. Its Scheme cannot be data because it comes
// from the configuration, so build assembles one and hands it to the generic
// engine. There is no timestamp and the ID source is the user's choice, so
// DedupeBody defaults to on.
func init() {
	register(Preset{
		Name: "hmac",
		// hmac stands for any sender: no document states how it delivers
		// (TestDeliveryFacts requires exactly this), so the spool is on by
		// default and max_body keeps the gateway's own default.
		Delivery:        allUndocumented,
		Doc:             "https://www.rfc-editor.org/rfc/rfc2104",
		SignatureHeader: "<header>: [<prefix>]<hex|base64> (configured)",
		DedupeBody:      true,
		Scheme: Scheme{
			Signed:    "{body}",
			Algorithm: "sha256",
			Encoding:  "hex",
		},
		build: buildHMAC,
	})
}

func buildHMAC(p Preset, o Options) (signer, error) {
	c := o.HMAC
	if c.Header == "" {
		return nil, errors.New("hmac header is required")
	}
	if !validHeaderName(c.Header) {
		return nil, fmt.Errorf("hmac header %q is not a valid header name", c.Header)
	}
	s := Scheme{
		Headers:       []HeaderSet{{Signature: c.Header}},
		Format:        Format{Prefix: c.Prefix},
		Signed:        "{body}",
		Algorithm:     strings.ToLower(c.Algorithm),
		Encoding:      strings.ToLower(c.Encoding),
		Secret:        "raw",
		TimestampUnit: time.Second,
	}
	if s.Algorithm == "" {
		s.Algorithm = "sha256"
	}
	if s.Encoding == "" {
		s.Encoding = "hex"
	}
	if err := s.validate(p); err != nil {
		return nil, err
	}
	return newEngine(p, s, o)
}

// validHeaderName reports whether name is an HTTP token (RFC 9110 5.1).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
