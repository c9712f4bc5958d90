package signature_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

func batchOf(t *testing.T, provider string) signature.Batch {
	t.Helper()
	p, ok := signature.Lookup(provider)
	require.True(t, ok)
	require.NotNil(t, p.Batch, provider)
	return *p.Batch
}

func itemIDs(items []signature.BatchItem) []string {
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.ID
	}
	return ids
}

func TestBatchSplit(t *testing.T) {
	t.Parallel()
	t.Run("sendgrid top-level array", func(t *testing.T) {
		t.Parallel()
		items, err := batchOf(t, "sendgrid").Split([]byte(`[{"sg_event_id":"e1","event":"open"}, {"sg_event_id":"e2","event":"click"}]`))
		require.NoError(t, err)
		require.Equal(t, []string{"e1", "e2"}, itemIDs(items))
		require.JSONEq(t, `[{"sg_event_id":"e1","event":"open"}]`, string(items[0].Body))
		require.JSONEq(t, `[{"sg_event_id":"e2","event":"click"}]`, string(items[1].Body))
	})
	t.Run("gocardless nested array keeps the envelope", func(t *testing.T) {
		t.Parallel()
		items, err := batchOf(t, "gocardless").Split([]byte(`{"events":[{"id":"EV1"},{"id":"EV2"}],"meta":{"webhook_id":"WB1"}}`))
		require.NoError(t, err)
		require.Equal(t, []string{"EV1", "EV2"}, itemIDs(items))
		require.JSONEq(t, `{"events":[{"id":"EV2"}],"meta":{"webhook_id":"WB1"}}`, string(items[1].Body))
	})
	t.Run("okta deep path", func(t *testing.T) {
		t.Parallel()
		items, err := batchOf(t, "okta").Split([]byte(`{"eventId":"x","data":{"events":[{"uuid":"u1"},{"uuid":"u2"}]}}`))
		require.NoError(t, err)
		require.Equal(t, []string{"u1", "u2"}, itemIDs(items))
		require.JSONEq(t, `{"eventId":"x","data":{"events":[{"uuid":"u1"}]}}`, string(items[0].Body))
	})
	t.Run("hubspot numeric ids", func(t *testing.T) {
		t.Parallel()
		items, err := batchOf(t, "hubspot").Split([]byte(`[{"eventId":100},{"eventId":18446744073709551617}]`))
		require.NoError(t, err)
		require.Equal(t, []string{"100", "18446744073709551617"}, itemIDs(items), "numbers keyed by their exact text")
	})
	t.Run("duplicate item within one body kept once", func(t *testing.T) {
		t.Parallel()
		items, err := batchOf(t, "sendgrid").Split([]byte(`[{"sg_event_id":"e1"},{"sg_event_id":"e1"}]`))
		require.NoError(t, err)
		require.Equal(t, []string{"e1"}, itemIDs(items))
	})
	errCases := []struct{ name, body string }{
		{"not JSON", `[{"sg_event_id":"e1"`},
		{"not an array", `{"sg_event_id":"e1"}`},
		{"item without id", `[{"sg_event_id":"e1"},{"event":"open"}]`},
		{"id is an object", `[{"sg_event_id":{"a":1}}]`},
		{"empty id", `[{"sg_event_id":""}]`},
		{"id longer than 255 bytes", `[{"sg_event_id":"` + strings.Repeat("x", 256) + `"}]`},
	}
	for _, tc := range errCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := batchOf(t, "sendgrid").Split([]byte(tc.body))
			require.ErrorIs(t, err, signature.ErrBadBatch)
		})
	}
	// A repeated member name on the items path or an item's ID path
	// (after unescaping, or ignoring case) is refused as the top-level
	// event ID is: the upstream's parser may read the other items or IDs.
	ambiguous := []struct{ name, provider, body string }{
		{"item id twice", "sendgrid", `[{"sg_event_id":"e1","event":"open"},{"sg_event_id":"e2","sg_event_id":"e3"}]`},
		{"item id twice ignoring case", "sendgrid", `[{"sg_event_id":"e1","SG_EVENT_ID":"e2"}]`},
		{"item id twice after unescaping", "sendgrid", `[{"sg_event_id":"e1","sg_event_i\u0064":"e2"}]`},
		{"hubspot numeric item id twice", "hubspot", `[{"eventId":100,"eventId":101}]`},
		{"items array twice", "gocardless", `{"events":[{"id":"EV1"}],"events":[{"id":"EV2"}]}`},
		{"items parent twice", "okta", `{"eventId":"x","data":{"events":[{"uuid":"u1"}]},"data":{"events":[{"uuid":"u2"}]}}`},
		{"items array twice ignoring case", "okta", `{"eventId":"x","data":{"events":[{"uuid":"u1"}],"Events":[{"uuid":"u2"}]}}`},
	}
	for _, tc := range ambiguous {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := batchOf(t, tc.provider)
			_, err := b.Split([]byte(tc.body))
			require.ErrorIs(t, err, eventid.ErrAmbiguous)
			require.True(t, b.Present([]byte(tc.body)), "a body naming its items ambiguously is keyed as a batch, so it is refused")
		})
	}
	// An item ID follows the top-level rules on its value too.
	t.Run("item id not text", func(t *testing.T) {
		t.Parallel()
		_, err := batchOf(t, "sendgrid").Split([]byte(`[{"sg_event_id":"e\u00001"}]`))
		require.ErrorIs(t, err, signature.ErrBadBatch)
		require.ErrorIs(t, err, eventid.ErrNotText)
	})
	t.Run("present", func(t *testing.T) {
		t.Parallel()
		b := batchOf(t, "okta")
		require.True(t, b.Present([]byte(`{"eventId":"x","data":{"events":[]}}`)))
		require.False(t, b.Present([]byte(`{"eventId":"x","data":{}}`)))
		require.False(t, b.Present([]byte(`{"eventId":"x","data":{"events":{}}}`)))
		require.True(t, batchOf(t, "sendgrid").Present([]byte(`[]`)))
		require.False(t, batchOf(t, "sendgrid").Present([]byte(`{}`)))
	})
	t.Run("empty batch", func(t *testing.T) {
		t.Parallel()
		_, err := batchOf(t, "gocardless").Split([]byte(`{"events":[]}`))
		require.ErrorIs(t, err, signature.ErrEmptyBatch)
	})
}

// SetKey: the same set in any order is one key; a re-batched retry with one
// more item is another (forwarded whole under policy set).
func TestBatchSetKey(t *testing.T) {
	t.Parallel()
	b := batchOf(t, "sendgrid")
	key := func(body string) string {
		items, err := b.Split([]byte(body))
		require.NoError(t, err)
		return signature.SetKey(items)
	}
	k12 := key(`[{"sg_event_id":"e1"},{"sg_event_id":"e2"}]`)
	require.Equal(t, k12, key(`[{"sg_event_id":"e2"},{"sg_event_id":"e1"}]`))
	require.NotEqual(t, k12, key(`[{"sg_event_id":"e1"},{"sg_event_id":"e2"},{"sg_event_id":"e3"}]`))
	// IDs holding the separator a naive join would use stay distinct.
	require.NotEqual(t, key(`[{"sg_event_id":"a\nb"}]`), key(`[{"sg_event_id":"a"},{"sg_event_id":"b"}]`))
	require.Len(t, k12, len("set:")+64)
}

func TestBatchPresets(t *testing.T) {
	t.Parallel()
	for _, name := range signature.Providers() {
		p, _ := signature.Lookup(name)
		if p.Batch == nil {
			continue
		}
		require.Contains(t, []signature.BatchPolicy{signature.BatchSet, signature.BatchSplit}, p.Batch.Policy, name)
	}
	for _, name := range []string{"sendgrid", "gocardless", "okta", "hubspot"} {
		p, _ := signature.Lookup(name)
		require.NotNil(t, p.Batch, name)
	}
}
