package store

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Response is an upstream's answer stored with a completed event, so
// later deliveries of the event can be answered with it (replay response,
// and the Idempotency-Key mode). It is data a provider or client sent to
// someone: it never reaches logs, and operators see only its ResponseInfo.
type Response struct {
	// Status is the upstream's final HTTP status.
	Status int
	// Header holds the allow-listed headers of the answer, canonical names;
	// never hop-by-hop headers or Content-Length.
	Header http.Header
	// Body is the answer's body when it was stored (BodyStored), else nil.
	Body []byte
	// Size is the length of the upstream's body in bytes, stored or not;
	// 0 when Cut.
	Size int64
	// SHA256 is the hex SHA-256 of the upstream's whole body, stored or
	// not; "" when Cut.
	SHA256 string
	// BodyStored: Body holds the whole body. False when it was larger than
	// the route's replay_max or was cut: then only status and headers are
	// stored, and the gateway does not replay a body (see the README's
	// "Replayed answers").
	BodyStored bool
	// Cut: the body was cut before its end (the upstream's or the client's
	// connection failed mid-body), so neither it nor its size and hash are
	// known. Stored as a response_size of -1 (cutSize).
	Cut bool
	// Fingerprint is the request fingerprint of the claim that completed
	// the event (Idempotency-Key mode); "" elsewhere.
	Fingerprint string
}

// ResponseInfo describes a stored response without its content: what the
// admin API shows.
type ResponseInfo struct {
	// Stored: a response (status and headers at least) is stored.
	Stored bool
	// BodyStored: its body is stored too (see Response.BodyStored).
	BodyStored bool
	// Cut: the body was cut before its end; Size and SHA256 are then
	// unknown (0 and "").
	Cut bool
	// Size and SHA256 describe the upstream's body (see Response).
	Size   int64
	SHA256 string
}

// cutSize is the response_size recorded for a body that was cut: its size
// is unknown.
const cutSize = -1

// NewResponseInfo describes a row's stored response from its columns:
// whether response_headers is set, the length of response_body (0 when
// NULL), response_size and response_sha256. Drivers build
// Event.Response with it.
func NewResponseInfo(stored bool, bodyLen, size int64, sha string) ResponseInfo {
	switch {
	case !stored:
		return ResponseInfo{}
	case size == cutSize:
		return ResponseInfo{Stored: true, Cut: true}
	}
	return ResponseInfo{Stored: true, BodyStored: bodyLen == size, Size: size, SHA256: sha}
}

// EncodeHeader is the stored form of a response's headers: a JSON object
// of canonical names to value lists ("{}" when there are none, so a stored
// response is told apart from none by a non-empty text).
func EncodeHeader(h http.Header) (string, error) {
	if h == nil {
		h = http.Header{}
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("encoding response headers: %w", err)
	}
	return string(b), nil
}

// DecodeHeader reverses EncodeHeader.
func DecodeHeader(s string) (http.Header, error) {
	h := http.Header{}
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("decoding response headers: %w", err)
	}
	return h, nil
}
