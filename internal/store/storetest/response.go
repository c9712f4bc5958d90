package storetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// exerciseResponse covers stored responses (CompleteResponse, Response,
// Get's ResponseInfo) and the claim's fingerprint.
func exerciseResponse(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()

	twiml := []byte(`<?xml version="1.0" encoding="UTF-8"?><Response><Message>Thanks!</Message></Response>`)
	sum := func(b []byte) string {
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}

	t.Run("CompleteResponseThenRead", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		c := claimed(t, s, "twilio", "SM1")
		resp := store.Response{
			Status: 200,
			Header: http.Header{"Content-Type": {"application/xml; charset=utf-8"}, "Location": {"/m/1"}},
			Body:   twiml, Size: int64(len(twiml)), SHA256: sum(twiml), BodyStored: true,
		}
		require.NoError(t, s.CompleteResponse(ctx, "twilio", "SM1", c.Token, resp))

		got, err := s.Response(ctx, "twilio", "SM1")
		require.NoError(t, err)
		require.Equal(t, 200, got.Status)
		require.Equal(t, resp.Header, got.Header)
		require.True(t, bytes.Equal(twiml, got.Body), "body byte-for-byte")
		require.True(t, got.BodyStored)
		require.Equal(t, int64(len(twiml)), got.Size)
		require.Equal(t, sum(twiml), got.SHA256)

		d := claim(t, s, "twilio", "SM1")
		require.Equal(t, store.Duplicate, d.Outcome)
		require.Equal(t, 200, d.Status)

		ev, err := s.Get(ctx, "twilio", "SM1")
		require.NoError(t, err)
		require.Equal(t, store.StateCompleted, ev.State)
		require.Equal(t, store.ResponseInfo{Stored: true, BodyStored: true, Size: int64(len(twiml)), SHA256: sum(twiml)}, ev.Response)

		// Settled once: the token no longer holds the row.
		require.ErrorIs(t, s.CompleteResponse(ctx, "twilio", "SM1", c.Token, resp), store.ErrLeaseLost)
	})

	t.Run("HeadersOnlyAndEmptyBody", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		big := bytes.Repeat([]byte("x"), 200<<10)
		c := claimed(t, s, "r", "big")
		require.NoError(t, s.CompleteResponse(ctx, "r", "big", c.Token, store.Response{
			Status: 201, Header: http.Header{"Content-Type": {"text/plain"}},
			Size: int64(len(big)), SHA256: sum(big), // body not stored
		}))
		got, err := s.Response(ctx, "r", "big")
		require.NoError(t, err)
		require.Equal(t, 201, got.Status)
		require.False(t, got.BodyStored)
		require.Nil(t, got.Body)
		require.Equal(t, int64(len(big)), got.Size)
		ev, err := s.Get(ctx, "r", "big")
		require.NoError(t, err)
		require.Equal(t, store.ResponseInfo{Stored: true, Size: int64(len(big)), SHA256: sum(big)}, ev.Response)

		// A 204: an empty body is stored whole.
		c = claimed(t, s, "r", "empty")
		require.NoError(t, s.CompleteResponse(ctx, "r", "empty", c.Token, store.Response{
			Status: 204, SHA256: sum(nil), BodyStored: true,
		}))
		got, err = s.Response(ctx, "r", "empty")
		require.NoError(t, err)
		require.Equal(t, 204, got.Status)
		require.True(t, got.BodyStored)
		require.Empty(t, got.Body)
		require.Equal(t, http.Header{}, got.Header)
	})

	// A cut body is stored as neither body, size nor hash: what was seen
	// of it is not the upstream's answer. Also with no byte seen (a
	// Content-Length the upstream never sent), which must not read back
	// as an empty body stored whole.
	t.Run("CutBody", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		for _, seen := range [][]byte{[]byte(`{"partial":`), nil} {
			id := "cut" + strconv.Itoa(len(seen))
			c := claimed(t, s, "r", id)
			require.NoError(t, s.CompleteResponse(ctx, "r", id, c.Token, store.Response{
				Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
				Body: seen, Size: int64(len(seen)), SHA256: sum(seen), Cut: true,
			}))
			got, err := s.Response(ctx, "r", id)
			require.NoError(t, err)
			require.Equal(t, 201, got.Status)
			require.Equal(t, "application/json", got.Header.Get("Content-Type"))
			require.True(t, got.Cut, id)
			require.False(t, got.BodyStored, id)
			require.Nil(t, got.Body)
			require.Zero(t, got.Size)
			require.Empty(t, got.SHA256)
			ev, err := s.Get(ctx, "r", id)
			require.NoError(t, err)
			require.Equal(t, store.ResponseInfo{Stored: true, Cut: true}, ev.Response, id)
			require.Equal(t, 201, ev.Status)
		}
	})

	t.Run("NoStoredResponse", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		_, err := s.Response(ctx, "r", "missing")
		require.ErrorIs(t, err, store.ErrNotFound)

		c := claimed(t, s, "r", "plain")
		_, err = s.Response(ctx, "r", "plain")
		require.ErrorIs(t, err, store.ErrNotFound, "processing")
		require.NoError(t, s.Complete(ctx, "r", "plain", c.Token, 200))
		_, err = s.Response(ctx, "r", "plain")
		require.ErrorIs(t, err, store.ErrNotFound, "completed without a response")
		ev, err := s.Get(ctx, "r", "plain")
		require.NoError(t, err)
		require.Equal(t, store.ResponseInfo{}, ev.Response)
	})

	t.Run("RetentionRemovesResponse", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()

		c := claimed(t, s, "r", "old")
		require.NoError(t, s.CompleteResponse(ctx, "r", "old", c.Token, store.Response{
			Status: 200, Body: twiml, Size: int64(len(twiml)), SHA256: sum(twiml), BodyStored: true,
		}))
		n, err := s.DeleteBefore(ctx, []string{"r"}, time.Now().Add(time.Minute), 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, err = s.Response(ctx, "r", "old")
		require.ErrorIs(t, err, store.ErrNotFound)
		require.Equal(t, store.Claimed, claim(t, s, "r", "old").Outcome)
	})

	t.Run("Fingerprint", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		p := store.ClaimParams{Scope: "api", EventID: "k1", Lease: lease, Fingerprint: "sha256:aa"}

		c, err := s.Claim(ctx, p)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c.Outcome)

		// In flight: the holder's fingerprint, whatever the asker's.
		p2 := p
		p2.Fingerprint = "sha256:bb"
		f, err := s.Claim(ctx, p2)
		require.NoError(t, err)
		require.Equal(t, store.InFlight, f.Outcome)
		require.Equal(t, "sha256:aa", f.Fingerprint)

		// Released (a 5xx): the next claim records its own fingerprint.
		require.NoError(t, s.Release(ctx, "api", "k1", c.Token))
		c2, err := s.Claim(ctx, p2)
		require.NoError(t, err)
		require.Equal(t, store.Claimed, c2.Outcome)
		require.NoError(t, s.CompleteResponse(ctx, "api", "k1", c2.Token, store.Response{Status: 201, BodyStored: true}))

		d, err := s.Claim(ctx, p)
		require.NoError(t, err)
		require.Equal(t, store.Duplicate, d.Outcome)
		require.Equal(t, "sha256:bb", d.Fingerprint)
		got, err := s.Response(ctx, "api", "k1")
		require.NoError(t, err)
		require.Equal(t, "sha256:bb", got.Fingerprint)
		ev, err := s.Get(ctx, "api", "k1")
		require.NoError(t, err)
		require.Equal(t, "sha256:bb", ev.Fingerprint)
	})
}
