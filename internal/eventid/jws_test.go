package eventid_test

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

// The jws source reads Apple's notificationUUID inside the payload of the
// signedPayload JWS (App Store Server Notifications V2).
func TestJWSPayloadSource(t *testing.T) {
	src, err := eventid.ParseSource("jws", "signedPayload#notificationUUID")
	require.NoError(t, err)
	x, err := eventid.New([][]eventid.Source{{src}})
	require.NoError(t, err)
	jws := func(payload string) string {
		return `{"signedPayload":"eyJhbGciOiJFUzI1NiJ9.` + base64.RawURLEncoding.EncodeToString([]byte(payload)) + `.c2ln"}`
	}

	id, err := x.Extract([]byte(jws(`{"notificationUUID":"002e14d5-51f5-4503-b5a8-c3a1af68eb20","data":{}}`)), nil)
	require.NoError(t, err)
	require.Equal(t, "002e14d5-51f5-4503-b5a8-c3a1af68eb20", id)

	for _, tc := range []struct {
		name, body string
		want       error
	}{
		{"no notificationUUID", jws(`{"data":{}}`), eventid.ErrMissing},
		{"notificationUUID twice", jws(`{"notificationUUID":"a","notificationUUID":"b"}`), eventid.ErrAmbiguous},
		{"not a JWS", `{"signedPayload":"abc"}`, eventid.ErrBadBody},
		{"no signedPayload", `{"x":1}`, eventid.ErrMissing},
		{"payload not JSON", `{"signedPayload":"a.` + base64.RawURLEncoding.EncodeToString([]byte("nope")) + `.c"}`, eventid.ErrBadBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := x.Extract([]byte(tc.body), nil)
			require.ErrorIs(t, err, tc.want)
		})
	}
	_, err = eventid.ParseSource("jws", "signedPayload")
	require.Error(t, err, "the payload path is required")
}
