package signature

import (
	"crypto/hmac"
	"hash"
	"io"
	"net/http"
)

// StreamVerifier checks a delivery whose body is read once from a stream,
// in memory that does not grow with the body: the gateway's path for a
// body too large to hold, kept in a temporary file while it is verified.
type StreamVerifier interface {
	// VerifyReader is Verify over the body read from body to its end. The
	// headers are checked before the body is read. Its errors are
	// Verify's, or body's own read error returned as is: that one wraps
	// no sentinel, as it is no verdict on the delivery.
	VerifyReader(body io.Reader, h http.Header) error
}

// Streaming returns v as a StreamVerifier when its scheme can verify a body
// it reads once: the generic engine's HMAC over the body (with any text,
// timestamp, ID or URL around it), the body signed once and not required
// to be a JSON object; or a plain token (GitLab), which binds no body.
// Otherwise nil: the scheme needs the whole body in
// memory (it parses JSON members, form fields or items, carries its
// signature inside the body, or checks a public-key signature over the
// whole message).
func Streaming(v Verifier) StreamVerifier {
	if t, ok := v.(*tokenVerifier); ok {
		return t
	}
	e, ok := v.(*engine)
	if !ok || e.jsonBody {
		return nil
	}
	bodies := 0
	for _, pt := range e.parts {
		if pt.kind == partBody {
			bodies++
		}
	}
	if bodies != 1 {
		return nil
	}
	return e
}

// VerifyReader implements StreamVerifier: one HMAC per secret, all fed
// from one pass over the body.
func (e *engine) VerifyReader(body io.Reader, h http.Header) error {
	s, err := e.read(h)
	if err != nil {
		return err
	}
	defer s.release()
	macs := make([]hash.Hash, len(e.keys))
	ws := make([]io.Writer, len(e.keys))
	for i, key := range e.keys {
		macs[i] = hmac.New(s.v.hash, key)
		ws[i] = macs[i]
	}
	w := io.MultiWriter(ws...)
	for _, pt := range e.parts {
		if pt.kind == partBody {
			if _, err := io.Copy(w, body); err != nil {
				return err
			}
			continue
		}
		_, _ = io.WriteString(w, e.text(pt, s.ts, s.id))
	}
	for _, m := range macs {
		sum := m.Sum(nil)
		for _, sig := range s.sigs {
			if hmac.Equal(sum, sig) {
				return nil
			}
		}
	}
	return e.noMatch(s)
}
