package signature_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// TestMatchHandshake runs each provider's documented handshake request
// through MatchHandshake and checks the answer byte for byte, plus a near
// miss that must not be taken for a handshake.
func TestMatchHandshake(t *testing.T) {
	t.Parallel()
	zoomMAC := hmac.New(sha256.New, []byte("zoom-secret"))
	zoomMAC.Write([]byte("qgg8vlvZRS6UYooatFL8Aw"))
	cases := []struct {
		name, provider, method, target, body string
		header                               map[string]string
		want                                 bool
		auth                                 signature.ChallengeAuth
		status                               int
		contentType, answer                  string
		answerHeader                         map[string]string
		token, secret                        string
		forward                              bool
	}{
		{
			name: "meta subscribe", provider: "meta", method: http.MethodGet,
			target: "/wh?hub.mode=subscribe&hub.verify_token=vt-1&hub.challenge=1158201444",
			want:   true, auth: signature.AuthVerifyToken, status: 200, contentType: "text/plain; charset=utf-8",
			answer: "1158201444", token: "vt-1",
		},
		{name: "meta delivery is no handshake", provider: "meta", method: http.MethodPost, target: "/wh", body: `{"object":"page"}`},
		{name: "meta other mode", provider: "meta", method: http.MethodGet, target: "/wh?hub.mode=unsubscribe&hub.challenge=1"},
		{
			name: "graph validation", provider: "msgraph", method: http.MethodPost,
			target: "/wh?validationToken=Validation%3A%20Testing%20client%20application",
			want:   true, auth: signature.AuthNone, status: 200, contentType: "text/plain; charset=utf-8",
			answer: "Validation: Testing client application",
		},
		{name: "graph notification", provider: "msgraph", method: http.MethodPost, target: "/wh", body: `{"value":[]}`},
		{
			name: "dropbox challenge", provider: "dropbox", method: http.MethodGet, target: "/wh?challenge=abc123",
			want: true, auth: signature.AuthNone, status: 200, contentType: "text/plain; charset=utf-8", answer: "abc123",
			answerHeader: map[string]string{"X-Content-Type-Options": "nosniff"},
		},
		{name: "dropbox get without challenge", provider: "dropbox", method: http.MethodGet, target: "/wh"},
		{name: "trello HEAD probe", provider: "trello", method: http.MethodHead, target: "/wh", want: true, auth: signature.AuthNone, status: 200},
		{name: "trello POST", provider: "trello", method: http.MethodPost, target: "/wh", body: `{"action":{}}`},
		{
			name: "asana X-Hook-Secret", provider: "asana", method: http.MethodPost, target: "/wh",
			header: map[string]string{"X-Hook-Secret": "b537207f20cbfa02357cf448134da559e8bd39d61597dcd5631b8012eae53e81"},
			want:   true, auth: signature.AuthNone, status: 200,
			answerHeader: map[string]string{"X-Hook-Secret": "b537207f20cbfa02357cf448134da559e8bd39d61597dcd5631b8012eae53e81"},
			secret:       "b537207f20cbfa02357cf448134da559e8bd39d61597dcd5631b8012eae53e81",
		},
		{
			name: "asana heartbeat", provider: "asana", method: http.MethodPost, target: "/wh", body: `{"events":[]}`,
			want: true, auth: signature.AuthSignature, status: 200,
		},
		{name: "asana events", provider: "asana", method: http.MethodPost, target: "/wh", body: `{"events":[{"action":"changed"}]}`},
		{
			name: "okta verification", provider: "okta", method: http.MethodGet, target: "/wh",
			header: map[string]string{"X-Okta-Verification-Challenge": "VVkW3lBBr7XfUDdbgo9r"},
			want:   true, auth: signature.AuthNone, status: 200, contentType: "application/json",
			answer: `{"verification":"VVkW3lBBr7XfUDdbgo9r"}`,
		},
		{
			name: "twitch callback verification", provider: "twitch", method: http.MethodPost, target: "/wh",
			header: map[string]string{"Twitch-Eventsub-Message-Type": "webhook_callback_verification"},
			body:   `{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387"}}`,
			want:   true, auth: signature.AuthSignature, status: 200, contentType: "text/plain; charset=utf-8",
			answer: "pogchamp-kappa-360noscope-vohiyo",
		},
		{
			name: "twitch notification", provider: "twitch", method: http.MethodPost, target: "/wh",
			header: map[string]string{"Twitch-Eventsub-Message-Type": "notification"}, body: `{"challenge":"x"}`,
		},
		{
			name: "slack url_verification", provider: "slack", method: http.MethodPost, target: "/wh",
			body: `{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}`,
			want: true, auth: signature.AuthSignature, status: 200, contentType: "application/json",
			answer: `{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}`,
		},
		{
			name: "zoom url_validation", provider: "zoom", method: http.MethodPost, target: "/wh",
			body: `{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}`,
			want: true, auth: signature.AuthSignature, status: 200, contentType: "application/json",
			answer: `{"encryptedToken":"` + hex.EncodeToString(zoomMAC.Sum(nil)) + `","plainToken":"qgg8vlvZRS6UYooatFL8Aw"}`,
		},
		{
			name: "discord PING", provider: "discord", method: http.MethodPost, target: "/wh", body: `{"type":1,"id":"1"}`,
			want: true, auth: signature.AuthSignature, status: 200, contentType: "application/json", answer: `{"type":1}`,
		},
		{name: "discord command", provider: "discord", method: http.MethodPost, target: "/wh", body: `{"type":2,"id":"1"}`},
		{
			name: "notion verification", provider: "notion", method: http.MethodPost, target: "/wh",
			body: `{"verification_token":"secret_tMrlL1qK5vuQAh1b6cZGhFChZTSYJlce98V0pYn7yBl"}`,
			want: true, auth: signature.AuthNone, status: 200, secret: "secret_tMrlL1qK5vuQAh1b6cZGhFChZTSYJlce98V0pYn7yBl",
		},
		{
			name: "xero intent to receive", provider: "xero", method: http.MethodPost, target: "/wh",
			body: `{"events":[],"firstEventSequence":0,"lastEventSequence":0,"entropy":"S0m3r4Nd0mt3xt"}`,
			want: true, auth: signature.AuthSignature, status: 200,
		},
		{name: "stripe has none", provider: "stripe", method: http.MethodGet, target: "/wh?challenge=1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, ok := signature.Lookup(tc.provider)
			require.True(t, ok)
			r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			a, ok := p.MatchHandshake(r, []byte(tc.body), "zoom-secret")
			require.Equal(t, tc.want, ok)
			if !tc.want {
				return
			}
			require.Equal(t, tc.auth, a.Challenge.Auth)
			require.Equal(t, tc.forward, a.Forward)
			require.Equal(t, tc.token, a.Token)
			require.Equal(t, tc.secret, a.Secret)
			w := httptest.NewRecorder()
			a.Respond(w)
			require.Equal(t, tc.status, w.Code)
			require.Equal(t, tc.contentType, w.Header().Get("Content-Type"))
			if strings.HasPrefix(tc.answer, "{") {
				require.JSONEq(t, tc.answer, w.Body.String())
			} else {
				require.Equal(t, tc.answer, w.Body.String())
			}
			for k, v := range tc.answerHeader {
				require.Equal(t, v, w.Header().Get(k))
			}
		})
	}
}

func TestHandshakeCheckToken(t *testing.T) {
	t.Parallel()
	p, _ := signature.Lookup("meta")
	r := httptest.NewRequest(http.MethodGet, "/?hub.mode=subscribe&hub.verify_token=right&hub.challenge=42", nil)
	a, ok := p.MatchHandshake(r, nil, "")
	require.True(t, ok)
	require.True(t, a.CheckToken([]string{"old", "right"}))
	require.False(t, a.CheckToken([]string{"wrong"}))
	require.False(t, a.CheckToken(nil))

	r = httptest.NewRequest(http.MethodGet, "/?hub.mode=subscribe&hub.challenge=42", nil)
	a, ok = p.MatchHandshake(r, nil, "")
	require.True(t, ok)
	require.False(t, a.CheckToken([]string{""}), "an absent token never matches an empty configured one")
}

// A request with a handshake's shape but without the value it echoes or
// teaches is still that handshake (never an event), Incomplete: the edge
// cannot answer it.
func TestHandshakeNeedsItsValue(t *testing.T) {
	t.Parallel()
	p, _ := signature.Lookup("twitch")
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Twitch-Eventsub-Message-Type", "webhook_callback_verification")
	for _, body := range []string{`{"challenge":""}`, `{"challenge":42}`, `{}`} {
		a, ok := p.MatchHandshake(r, []byte(body), "")
		require.True(t, ok, body)
		require.Equal(t, "json challenge", a.Incomplete, body)
		require.Zero(t, a.Status)
		require.Empty(t, a.Body)
	}
	a, ok := p.MatchHandshake(r, []byte(`{"challenge":"c"}`), "")
	require.True(t, ok)
	require.Empty(t, a.Incomplete)
	n, _ := signature.Lookup("notion")
	a, ok = n.MatchHandshake(httptest.NewRequest(http.MethodPost, "/", nil), []byte(`{"verification_token":""}`), "")
	require.True(t, ok)
	require.Equal(t, "json verification_token", a.Incomplete)
	require.Empty(t, a.Secret)
	m, _ := signature.Lookup("meta")
	a, ok = m.MatchHandshake(httptest.NewRequest(http.MethodGet, "/?hub.mode=subscribe&hub.verify_token=t", nil), nil, "")
	require.True(t, ok)
	require.Equal(t, "query hub.challenge", a.Incomplete)
	require.Equal(t, "t", a.Token, "the token is still read, to be checked first")
}

// Signed handshakes are recognised on their header or body alone (twitch,
// asana's heartbeat); Asana's X-Hook-Secret handshake is unauthenticated.
func TestSignedHandshakes(t *testing.T) {
	t.Parallel()
	match := func(provider string, body string, hdr ...string) (signature.HandshakeAnswer, bool) {
		p, _ := signature.Lookup(provider)
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return p.MatchHandshake(r, []byte(body), "")
	}
	a, ok := match("twitch", `{"challenge":"c"}`, "Twitch-Eventsub-Message-Type", "webhook_callback_verification")
	require.True(t, ok)
	require.Equal(t, signature.AuthSignature, a.Challenge.Auth)
	_, ok = match("twitch", `{"challenge":"c"}`)
	require.False(t, ok)
	a, ok = match("asana", `{"events":[]}`)
	require.True(t, ok)
	require.Equal(t, signature.AuthSignature, a.Challenge.Auth)
	_, ok = match("asana", `{"events":[{}]}`)
	require.False(t, ok)
	a, ok = match("asana", ``, "X-Hook-Secret", "s")
	require.True(t, ok)
	require.Equal(t, signature.AuthNone, a.Challenge.Auth)
}

func TestChallengeDescribe(t *testing.T) {
	t.Parallel()
	p, _ := signature.Lookup("meta")
	require.Equal(t, "hub.challenge: GET ?hub.mode=subscribe → echo query hub.challenge as text (auth verify_token)", p.Challenges[0].Describe())
	a, _ := signature.Lookup("asana")
	require.Contains(t, a.Challenges[0].Describe(), "secret learned from header X-Hook-Secret")
}
