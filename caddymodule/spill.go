package caddymodule

// Bodies too large to hold: a delivery whose body passes spillAbove is
// written to a temporary file while it is read, verified by a streaming
// verifier over that file, hashed as it is written, and forwarded from it,
// so the memory a delivery takes does not grow with its body. Only routes
// whose every step can read the body as a stream spill (spillVerifier);
// the others keep their bodies in memory, at most max_body each.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// spillAbove is the largest body kept in memory on a route that spills:
// the largest pooled body buffer (maxPooledBuf), so every body held in
// memory comes from the pool and a larger one never grows a buffer.
const spillAbove = maxPooledBuf

// errSpillDisk is a failure of the temporary file itself (creating,
// writing or reading it): not the provider's fault, answered 503 so that
// a provider that retries sends the delivery again.
var errSpillDisk = errors.New("the body could not be kept on disk")

// spillVerifier returns the route's streaming verifier when its bodies may
// spill: a signature scheme that verifies a stream (signature.Streaming),
// in sync mode, with an event ID read from headers only, and no handshake,
// batch, single-use value, learned secret or gzip decoding reading the
// body itself. Otherwise nil: bodies stay in memory. Which routes spill is
// stated in docs/config.md (max_body).
func (h *Handler) spillVerifier() signature.StreamVerifier {
	if h.Provider == providerIdempotencyKey || h.Mode == "async" || h.learned != nil ||
		h.batch != nil || h.singleUse != nil || len(h.preset.Challenges) > 0 || h.extractor == nil {
		return nil
	}
	for _, alts := range h.extractor.Parts() {
		for _, s := range alts {
			if s.Kind != eventid.Header {
				return nil
			}
		}
	}
	return signature.Streaming(h.verifier)
}

// spillFile is a body kept in a temporary file (mode 0600, in the
// system's temporary directory), removed when the request ends
// (delivery.done, deferred by ServeHTTP, so also after a panic).
type spillFile struct {
	f    *os.File
	size int64
	// sum is the body's SHA-256, computed while it was written.
	sum [sha256.Size]byte
}

// copyBufs pools the copy buffers of spilled bodies.
var copyBufs = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}

// spillBody writes head, then what follows in body, to a new temporary
// file: at most limit+1 bytes in all, so that n > limit tells a body over
// the limit. The file is returned even with an error, for its removal. A
// failure of the file wraps errSpillDisk; body's read errors are returned
// as they are (a timeout, a provider gone).
func spillBody(head []byte, body io.Reader, limit int64) (s *spillFile, n int64, err error) {
	f, err := os.CreateTemp("", "caddy-webhook-body-*")
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", errSpillDisk, err)
	}
	s = &spillFile{f: f}
	sum := sha256.New()
	write := func(b []byte) error {
		sum.Write(b)
		if _, err := f.Write(b); err != nil {
			return fmt.Errorf("%w: %w", errSpillDisk, err)
		}
		return nil
	}
	if err := write(head); err != nil {
		return s, 0, err
	}
	n = int64(len(head))
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	for n <= limit {
		b := (*bp)[:min(int64(len(*bp)), limit+1-n)]
		m, rerr := body.Read(b)
		if m > 0 {
			if err := write(b[:m]); err != nil {
				return s, n, err
			}
			n += int64(m)
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return s, n, rerr
		}
	}
	s.size = n
	sum.Sum(s.sum[:0])
	return s, n, nil
}

// reader reads the body from its start; its read errors wrap errSpillDisk.
// Each reader is independent (ReadAt), so the transport and a hash may
// each have their own.
func (s *spillFile) reader() io.Reader {
	return diskReader{io.NewSectionReader(s.f, 0, s.size)}
}

type diskReader struct{ r io.Reader }

func (d diskReader) Read(b []byte) (int, error) {
	n, err := d.r.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: %w", errSpillDisk, err)
	}
	return n, err
}

// bytes reads the whole body into memory: for the spool, which writes a
// record from memory (a store outage; see docs/spool.md).
func (s *spillFile) bytes() ([]byte, error) {
	b := make([]byte, s.size)
	if _, err := io.ReadFull(s.reader(), b); err != nil {
		return nil, err
	}
	return b, nil
}

// key is bodyKey of the body.
func (s *spillFile) key() string { return "sha256:" + hex.EncodeToString(s.sum[:]) }

// deliveryKey is deliveryKey(id, body) of the body, read from the file.
func (s *spillFile) deliveryKey(id string) (string, error) {
	hs := sha256.New()
	writeIDPrefix(hs, id)
	if _, err := io.Copy(hs, s.reader()); err != nil {
		return "", err
	}
	return "delivery-sha256:" + hex.EncodeToString(hs.Sum(nil)), nil
}

// writeIDPrefix writes what deliveryKey hashes before the body: the ID's
// length, then the ID.
func writeIDPrefix(hs hash.Hash, id string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(id)))
	hs.Write(n[:])
	hs.Write([]byte(id))
}

// remove closes and deletes the file. A transport still reading it after
// the request ended (an upstream that answered before reading the whole
// body) then gets an error: that forward is over anyway.
func (s *spillFile) remove() {
	_ = s.f.Close()
	_ = os.Remove(s.f.Name())
}
