package signature

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// boxVerifier is the generic engine plus Box's second form of the signed
// bytes: Box's SDKs also accept a signature over the body with every
// character from U+007F up written as a \uXXXX escape (UTF-16 units, lower
// case) and every "/" not preceded by a backslash written "\/", the way
// Box serialises some payloads. The escaped form is tried only when the raw
// body did not match.
type boxVerifier struct{ e signer }

func buildBox(p Preset, o Options) (signer, error) {
	e, err := newEngine(p, p.Scheme, o)
	if err != nil {
		return nil, err
	}
	return boxVerifier{e}, nil
}

// Box's headers besides the primary signature: box-node-sdk's
// WebhooksManager.validateMessage computes a signature only when the
// version is "1" and the algorithm "HmacSHA256", and accepts the
// secondary signature (Box signs with both of the app's keys, so one can
// be rotated while the other still verifies).
const (
	boxSecondary = "BOX-SIGNATURE-SECONDARY"
	boxVersion   = "BOX-SIGNATURE-VERSION"
	boxAlgorithm = "BOX-SIGNATURE-ALGORITHM"
	boxPrimary   = "BOX-SIGNATURE-PRIMARY"
)

// Verify checks the version and algorithm headers, then the primary
// signature and, when it does not match or is absent, the secondary one,
// each over the raw body and then its escaped form, with every configured
// secret (an app's primary and secondary keys are both configured as
// secrets; the SDK pairs each key with its header, a pairing Box itself
// always keeps).
func (b boxVerifier) Verify(body []byte, h http.Header) error {
	if h.Get(boxPrimary) != "" || h.Get(boxSecondary) != "" {
		if v := h.Get(boxVersion); v != "1" {
			return fmt.Errorf("header %s is %q, want 1: %w", boxVersion, v, ErrMalformedHeader)
		}
		if a := h.Get(boxAlgorithm); a != "HmacSHA256" {
			return fmt.Errorf("header %s is %q, want HmacSHA256: %w", boxAlgorithm, a, ErrMalformedHeader)
		}
	}
	err := b.verifyOne(body, h)
	if err == nil || h.Get(boxSecondary) == "" || (!errors.Is(err, ErrNoMatchingSignature) && !errors.Is(err, ErrMissingHeader)) {
		return err
	}
	second := h.Clone()
	second.Set(boxPrimary, h.Get(boxSecondary))
	if b.verifyOne(body, second) == nil {
		return nil
	}
	return err
}

// verifyOne checks the primary header of h over body and its escaped form.
func (b boxVerifier) verifyOne(body []byte, h http.Header) error {
	err := b.e.Verify(body, h)
	if !errors.Is(err, ErrNoMatchingSignature) {
		return err
	}
	if escaped, changed := boxEscaped(body); changed {
		if b.e.Verify(escaped, h) == nil {
			return nil
		}
	}
	return err
}

func (b boxVerifier) sign(body []byte, h http.Header, ts time.Time) error {
	h.Set(boxVersion, "1")
	h.Set(boxAlgorithm, "HmacSHA256")
	return b.e.sign(body, h, ts)
}

// boxEscaped returns body as box-node-sdk's jsonStringifyWithEscapedUnicode
// rewrites it, and whether that differs from body. Invalid UTF-8 is left
// as is (JavaScript would have replaced it before hashing anyway).
func boxEscaped(body []byte) ([]byte, bool) {
	out := make([]byte, 0, len(body)+16)
	changed := false
	for i := 0; i < len(body); {
		c := body[i]
		if c < utf8.RuneSelf {
			switch {
			case c == 0x7f:
				out = append(out, `\u007f`...)
				changed = true
			case c == '/' && (len(out) == 0 || out[len(out)-1] != '\\'):
				out = append(out, '\\', '/')
				changed = true
			default:
				out = append(out, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && size == 1 {
			out = append(out, c)
			i++
			continue
		}
		units := []uint16{uint16(r)}
		if r > 0xffff {
			r1, r2 := utf16.EncodeRune(r)
			units = []uint16{uint16(r1), uint16(r2)}
		}
		for _, u := range units {
			hex := strconv.FormatUint(uint64(u), 16)
			out = append(out, `\u`...)
			for n := len(hex); n < 4; n++ {
				out = append(out, '0')
			}
			out = append(out, hex...)
		}
		changed = true
		i += size
	}
	return out, changed
}
