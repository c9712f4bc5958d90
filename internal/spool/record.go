package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"time"
)

// Record is one verified delivery kept in the spool: what is needed to claim
// its event and to hand the request to the upstream again, exactly as it
// arrived (the same method, target, headers and raw body bytes).
type Record struct {
	// Seq orders records by arrival; set by Append, starting at 1.
	Seq uint64
	// Arrived is when the delivery reached the gateway; set by Append from
	// Options.Now when zero.
	Arrived time.Time
	// Scope and EventID are the claim's key.
	Scope, EventID string
	// BodyKey is the key of the body's own claim (dedupe_body), "" for none.
	BodyKey string
	// Method, Host, URI (the request target as sent: path and query),
	// Proto and RemoteAddr describe the request line and its peer; Scheme
	// is "https" when it arrived over TLS, else "http".
	Method, Host, URI, Proto, RemoteAddr, Scheme string
	// Header holds every header as received, signatures included: the
	// spool's files are readable by the gateway's user only.
	Header http.Header
	// Body is the raw body as received (compressed if it came compressed).
	Body []byte
}

// Frame layout: a header of frameHeader bytes — the payload's length and
// the CRC-32C of the payload, both big-endian uint32 — then the payload.
// A record whose frame is cut short or whose CRC does not match was torn by
// a crash before its fsync returned, so it was never acknowledged to the
// provider: recovery drops it.
const (
	frameHeader = 8
	// maxPayload bounds a frame's length field, so a torn length is never
	// taken for a huge record.
	maxPayload = 1 << 30
	// payloadVersion is the first byte of a payload.
	payloadVersion = 1
	// seqOffset is where a payload carries its Seq (fixed width, so the
	// writer sets it after the caller encoded the rest).
	seqOffset = 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func checksum(p []byte) uint32 { return crc32.Checksum(p, crcTable) }

// errCorrupt is a payload that passed its CRC but does not decode: a bug or
// a file from an unknown version, never a torn write.
var errCorrupt = errors.New("spool record does not decode")

// encodePayload encodes r with a zero Seq (see setSeq).
func encodePayload(r *Record) []byte {
	n := 1 + 8 + 8 + len(r.Body) + 64
	for k, vs := range r.Header {
		n += len(k) + 4
		for _, v := range vs {
			n += len(v) + 4
		}
	}
	b := make([]byte, 0, n+len(r.Scope)+len(r.EventID)+len(r.BodyKey)+len(r.Method)+len(r.Host)+len(r.URI)+len(r.Proto)+len(r.RemoteAddr)+len(r.Scheme))
	b = append(b, payloadVersion)
	b = binary.BigEndian.AppendUint64(b, 0)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Arrived.UnixNano()))
	for _, s := range []string{r.Scope, r.EventID, r.BodyKey, r.Method, r.Host, r.URI, r.Proto, r.RemoteAddr, r.Scheme} {
		b = appendString(b, s)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for k, vs := range r.Header {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(r.Body)))
	return append(b, r.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// setSeq writes seq into an encoded payload.
func setSeq(p []byte, seq uint64) { binary.BigEndian.PutUint64(p[seqOffset:], seq) }

// frame returns the frame of payload p.
func frame(p []byte) []byte {
	f := make([]byte, frameHeader, frameHeader+len(p))
	binary.BigEndian.PutUint32(f[0:4], uint32(len(p)))
	binary.BigEndian.PutUint32(f[4:8], checksum(p))
	return append(f, p...)
}

// decoder reads a payload's fields in order; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errCorrupt
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.bytes()) }

// decodePayload decodes a payload whose CRC matched. withBody false skips
// the header and body (recovery needs only the key and times).
func decodePayload(p []byte, withBody bool) (*Record, error) {
	if len(p) < 17 || p[0] != payloadVersion {
		return nil, fmt.Errorf("%w: unknown version or short payload", errCorrupt)
	}
	r := &Record{
		Seq:     binary.BigEndian.Uint64(p[seqOffset:]),
		Arrived: time.Unix(0, int64(binary.BigEndian.Uint64(p[9:17]))),
	}
	d := &decoder{b: p[17:]}
	r.Scope, r.EventID, r.BodyKey = d.string(), d.string(), d.string()
	r.Method, r.Host, r.URI, r.Proto, r.RemoteAddr = d.string(), d.string(), d.string(), d.string(), d.string()
	r.Scheme = d.string()
	if !withBody || d.err != nil {
		return r, d.err
	}
	nh := d.uvarint()
	if nh > uint64(len(d.b)) {
		return nil, errCorrupt
	}
	r.Header = make(http.Header, nh)
	for range nh {
		k := d.string()
		nv := d.uvarint()
		if d.err != nil || nv > uint64(len(d.b)) {
			return nil, errCorrupt
		}
		vs := make([]string, 0, nv)
		for range nv {
			vs = append(vs, d.string())
		}
		r.Header[k] = vs
	}
	body := d.bytes()
	if d.err != nil {
		return nil, d.err
	}
	r.Body = append([]byte{}, body...)
	return r, nil
}

// Ack entries: the acknowledged record's Seq (big-endian uint64) and the
// CRC-32C of those 8 bytes. A torn or mismatched entry is ignored: its
// record is delivered again after a restart and found completed by its claim.
const ackSize = 12

func ackEntry(seq uint64) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, ackSize), seq)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func readAck(b []byte) (uint64, bool) {
	if len(b) < ackSize || binary.BigEndian.Uint32(b[8:12]) != crc32.Checksum(b[:8], crcTable) {
		return 0, false
	}
	return binary.BigEndian.Uint64(b[:8]), true
}
