package signature

import (
	"errors"
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

func (b boxVerifier) Verify(body []byte, h http.Header) error {
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
