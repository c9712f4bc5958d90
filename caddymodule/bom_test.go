package caddymodule

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

// A UTF-8 byte order mark before the JSON (SharePoint sends one) is
// skipped when the event ID is read; the signature covers the exact bytes,
// BOM included, and the upstream receives them unchanged. Before, provider
// hmac with event_id json id answered 400 "not JSON".
func TestJSONBodyWithBOM(t *testing.T) {
	t.Parallel()
	const secret = "gen_bom"
	g := newGateway(t, "webhook_idempotency {\n\tprovider hmac\n\tsecret "+secret+"\n\tevent_id json id\n\thmac {\n\t\theader X-Signature\n\t}\n}")
	body := append([]byte("\xEF\xBB\xBF"), `{"id":"evt_bom_1","type":"order.paid"}`...)
	deliver := func(signed []byte) answer {
		return g.serve(newDelivery("http://gateway.test/hook", body,
			"Content-Type", "application/json", "X-Signature", hexOf(mac256([]byte(secret), signed))))
	}

	require.Equal(t, http.StatusBadRequest, deliver(body[3:]).status, "a signature over the body without its BOM does not match")
	a := deliver(body)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Equal(t, body, g.up.call(t, 0).Body, "the exact bytes")
	g.requireRow(g.h.Scope, "evt_bom_1", store.StateCompleted)
	dup := deliver(body)
	require.Equal(t, "true", dup.header.Get("Idempotent-Replayed"))
	require.Equal(t, 1, g.up.count())
}
