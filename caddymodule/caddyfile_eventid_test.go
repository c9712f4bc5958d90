package caddymodule

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// One event_id line cannot mix kinds (a JSON path may be named json): the
// refusal says to write one line per part, and those lines adapt into the
// composite key (the WooCommerce example of the docs).
func TestEventIDMixedKindsSaysOneLinePerPart(t *testing.T) {
	site := func(lines string) string {
		return ":8080 {\n\twebhook_idempotency {\n\t\tprovider woocommerce\n\t\tsecret s\n" + lines + "\t}\n\trespond 200\n}\n"
	}
	_, err := adaptJSON(site("\t\tevent_id header X-WC-Webhook-ID json id json date_modified_gmt\n"))
	require.Error(t, err)
	require.Contains(t, err.Error(), "write one event_id line per part, e.g. event_id header X-WC-Webhook-ID, then event_id json <path>")

	out, err := adaptJSON(site("\t\tevent_id header X-WC-Webhook-ID\n\t\tevent_id json id date_modified_gmt\n"))
	require.NoError(t, err)
	require.Contains(t, out, `"event_id":[{"from":"header","name":"X-WC-Webhook-ID"},{"from":"json","name":"id"},{"from":"json","name":"date_modified_gmt"}]`)
}
