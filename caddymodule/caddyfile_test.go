package caddymodule

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/eventid"
)

func intPtr(n int) *int { return &n }

func TestUnmarshalCaddyfile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		input   string
		want    Handler
		wantErr string
		// config: the parser accepts it and checkConfig refuses it
		// (a rule on values, not syntax).
		config bool
	}{
		{
			name: "stripe minimal",
			input: `webhook_idempotency {
				provider stripe
				secret whsec_a
			}`,
			want: Handler{Provider: "stripe", Secrets: []string{"whsec_a"}},
		},
		{
			name: "everything",
			input: `webhook_idempotency {
				provider hmac
				secret s1
				secret {env.S2}
				tolerance 2m
				url https://hooks.example.test/x
				event_id json data.id
				event_id header X-Topic
				scope shop-a
				storage postgres "postgres://u@127.0.0.1/db"
				table hooks
				lease 10s
				retention 7d
				max_body 1KB
				cache 0
				forward_timeout 1m
				on_ambiguous hold
				on_missing_id forward
				hmac {
					header X-Signature
					algorithm sha512
					encoding base64
					prefix sha512=
				}
			}`,
			want: Handler{
				Provider: "hmac", Secrets: []string{"s1", "{env.S2}"},
				Tolerance: caddy.Duration(120e9), URL: "https://hooks.example.test/x",
				EventID: []eventid.Source{{Kind: eventid.JSON, Name: "data.id"}, {Kind: eventid.Header, Name: "X-Topic"}},
				Scope:   "shop-a",
				Storage: &Storage{Backend: "postgres", DSN: "postgres://u@127.0.0.1/db", Table: "hooks"},
				Lease:   caddy.Duration(10e9), Retention: caddy.Duration(7 * 24 * 3600e9),
				MaxBody: 1000, Cache: intPtr(0), ForwardTimeout: caddy.Duration(60e9),
				OnAmbiguous: "hold", OnMissingID: "forward",
				HMAC: &HMACConfig{Header: "X-Signature", Algorithm: "sha512", Encoding: "base64", Prefix: "sha512="},
			},
		},
		{
			name: "composite json paths",
			input: `webhook_idempotency {
				provider github
				secret s
				event_id json a b
				storage sqlite /tmp/x.db
				allow_sha1
			}`,
			want: Handler{
				Provider: "github", Secrets: []string{"s"}, AllowSHA1: true,
				EventID: []eventid.Source{{Kind: eventid.JSON, Name: "a"}, {Kind: eventid.JSON, Name: "b"}},
				Storage: &Storage{Backend: "sqlite", Path: "/tmp/x.db"},
			},
		},
		{
			name: "provider block overrides the preset",
			input: `webhook_idempotency {
				provider stripe {
					header X-Relayed-Signature
					tolerance 1m
					event_id json data.object.id
				}
				secret s
			}`,
			want: Handler{
				Provider: "stripe", Secrets: []string{"s"}, Tolerance: caddy.Duration(60e9),
				EventID: []eventid.Source{{Kind: eventid.JSON, Name: "data.object.id"}},
				HMAC:    &HMACConfig{Header: "X-Relayed-Signature"},
			},
		},
		{
			name: "provider hmac block",
			input: `webhook_idempotency {
				provider hmac {
					header X-Signature
					encoding base64
				}
				secret s
				event_id header X-Event-Id
			}`,
			want: Handler{
				Provider: "hmac", Secrets: []string{"s"},
				EventID: []eventid.Source{{Kind: eventid.Header, Name: "X-Event-Id"}},
				HMAC:    &HMACConfig{Header: "X-Signature", Encoding: "base64"},
			},
		},
		{name: "provider block repeats tolerance", input: "webhook_idempotency {\n provider stripe {\n tolerance 1m\n }\n tolerance 2m\n secret s\n}", wantErr: "tolerance already specified"},
		{name: "secret with two values", input: "webhook_idempotency {\n provider stripe\n secret hunter2 extra\n}", wantErr: "secret: want exactly one value"},
		// What an unset {$NAME} leaves after adaptation.
		{name: "secret with no value", input: "webhook_idempotency {\n provider stripe\n secret\n}", wantErr: "secret: no value; a {$NAME} placeholder whose variable is unset when the Caddyfile is adapted leaves nothing: set it, or write {env.NAME}"},
		{name: "no secret", input: "webhook_idempotency {\n provider stripe\n}", wantErr: "secret", config: true},
		{name: "no provider", input: "webhook_idempotency {\n secret s\n}", wantErr: "provider", config: true},
		{name: "unknown subdirective", input: "webhook_idempotency {\n provider stripe\n secret s\n frobnicate 1\n}", wantErr: `unknown subdirective "frobnicate" (every subdirective is in the config reference`},
		{name: "misspelt subdirective", input: "webhook_idempotency {\n provider stripe\n secrets s\n}", wantErr: `unknown subdirective "secrets": did you mean secret?`},
		{name: "misspelt value subdirective", input: "webhook_idempotency {\n provider stripe\n secret s\n retension 30d\n}", wantErr: `unknown subdirective "retension": did you mean retention?`},
		{name: "duration in words", input: "webhook_idempotency {\n provider stripe\n secret s\n retention 30days\n}", wantErr: `retention: invalid duration "30days" (write it as Caddy does: 30d`},
		{name: "repeated tolerance", input: "webhook_idempotency {\n provider stripe\n secret s\n tolerance 1m\n tolerance 2m\n}", wantErr: "tolerance already specified"},
		{name: "bad duration", input: "webhook_idempotency {\n provider stripe\n secret s\n lease soon\n}", wantErr: "lease: invalid duration"},
		{name: "bad size", input: "webhook_idempotency {\n provider stripe\n secret s\n max_body lots\n}", wantErr: "max_body: invalid size"},
		{name: "bad cache", input: "webhook_idempotency {\n provider stripe\n secret s\n cache -1\n}", wantErr: "cache:"},
		{name: "hmac without header", input: "webhook_idempotency {\n provider hmac\n secret s\n event_id json id\n}", wantErr: "hmac", config: true},
		{name: "hmac bad algorithm", input: "webhook_idempotency {\n provider hmac\n secret s\n hmac {\n header X\n algorithm md5\n }\n}", wantErr: "hmac algorithm"},
		{name: "bad event_id source", input: "webhook_idempotency {\n provider stripe\n secret s\n event_id query id\n}", wantErr: "event_id"},
		{name: "storage with no DSN", input: "webhook_idempotency {\n provider stripe\n secret s\n storage postgres\n}", wantErr: "storage postgres: no DSN; a {$NAME} placeholder whose variable is unset"},
		{name: "storage with one word", input: "webhook_idempotency {\n provider stripe\n secret s\n storage /var/lib/events.db\n}", wantErr: "storage: want postgres <dsn> or sqlite <path>"},
		{name: "bad storage", input: "webhook_idempotency {\n provider stripe\n secret s\n storage redis x\n}", wantErr: "storage", config: true},
		{name: "bad on_ambiguous", input: "webhook_idempotency {\n provider stripe\n secret s\n on_ambiguous maybe\n}", wantErr: "on_ambiguous", config: true},
		{name: "args on directive", input: "webhook_idempotency foo {\n provider stripe\n secret s\n}", wantErr: "wrong argument count"},
		// The protocol rules between fields (handshake.go, batch.go) are
		// checkConfig's too.
		{name: "verify_token without a token handshake", input: "webhook_idempotency {\n provider stripe\n secret s\n verify_token t\n}", wantErr: "verify_token: provider stripe has no handshake with a verify token", config: true},
		{name: "verify_token unset", input: "webhook_idempotency {\n provider meta\n secret s\n event_id json id\n verify_token {env.WEBHOOK_IDEMPOTENCY_TEST_UNSET}\n}", wantErr: "verify_token: a verify token is empty", config: true},
		{name: "learned_secret replace without a learned secret", input: "webhook_idempotency {\n provider stripe\n secret s\n learned_secret replace\n}", wantErr: "learned_secret: provider stripe learns no secret", config: true},
		{name: "batch on a provider that does not batch", input: "webhook_idempotency {\n provider stripe\n secret s\n batch split\n}", wantErr: "batch: provider stripe sends one event per delivery", config: true},
		{name: "batch with event_id", input: "webhook_idempotency {\n provider gocardless\n secret s\n event_id json events.0.id\n batch set\n}", wantErr: "cannot be combined with event_id", config: true},
		{name: "batch split in async mode", input: "webhook_idempotency {\n provider gocardless\n secret s\n batch split\n mode async\n deliver_to http://127.0.0.1:9\n storage postgres \"postgres://u@127.0.0.1:1/db\"\n}", wantErr: "batch: split is not available in mode async", config: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if tc.config {
				require.NoError(t, err, "syntax")
				require.ErrorContains(t, h.prepareConfig(), tc.wantErr)
				return
			}
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.ErrorContains(t, err, "Testfile:") // errors carry file and line
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, h)
		})
	}
}

func FuzzUnmarshalCaddyfile(f *testing.F) {
	for _, s := range []string{
		"webhook_idempotency {\n provider stripe\n secret s\n}",
		"webhook_idempotency {\n provider hmac\n secret s\n hmac {\n header X\n }\n event_id json a b\n}",
		"webhook_idempotency {\n cache 1\n max_body 1KB\n lease 1s\n}",
		"webhook_idempotency {",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		var h Handler
		_ = h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)) // must not panic
	})
}

// The protocol fields' values, which only JSON can get wrong (the
// Caddyfile parser refuses them), are checked by checkConfig before any
// I/O; their defaults are applied with the others.
func TestProtocolConfigChecked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		h    Handler
		want string
	}{
		{"handshake", Handler{Provider: "slack", Secrets: []string{"s"}, ProtocolConfig: ProtocolConfig{Handshake: "maybe"}}, `handshake: want edge or forward, got "maybe"`},
		{"learned_secret", Handler{Provider: "asana", EventID: []eventid.Source{{Kind: eventid.JSON, Name: "id"}}, ProtocolConfig: ProtocolConfig{LearnedSecret: "always"}}, `learned_secret: want keep or replace, got "always"`},
		{"batch", Handler{Provider: "sendgrid", Secrets: []string{"s"}, ProtocolConfig: ProtocolConfig{Batch: "each"}}, `batch: want set or split, got "each"`},
		// Adyen signs each item: items of captured deliveries put together
		// verify as a new set (a verification trial ran two items twice).
		{"adyen batch set", Handler{Provider: "adyen", Secrets: []string{"00ff"}, ProtocolConfig: ProtocolConfig{Batch: "set"}}, `batch: set is not available for adyen`},
		{"adyen async", Handler{Provider: "adyen", Secrets: []string{"00ff"}, AsyncConfig: AsyncConfig{Mode: "async", DeliverTo: "http://127.0.0.1:1"},
			Storage: &Storage{Backend: "postgres", DSN: "postgres://127.0.0.1:1/x"}}, `batch: mode async is not available for adyen`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.ErrorContains(t, tc.h.prepareConfig(), tc.want)
			require.ErrorContains(t, tc.h.Validate(), tc.want)
		})
	}
	h := Handler{Provider: "slack", Secrets: []string{"s"}}
	require.NoError(t, h.prepareConfig())
	require.Equal(t, "edge", h.Handshake)
	require.Equal(t, "keep", h.LearnedSecret)
}

// Every name an unknown subdirective is compared with parses as a
// subdirective, and every subdirective of the syntax block (the config
// reference's) is among them.
func TestSubdirectivesKnown(t *testing.T) {
	t.Parallel()
	h := new(Handler)
	known := slices.Concat(slices.Sorted(maps.Keys(h.values())), subdirectives)
	for _, name := range known {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("webhook_idempotency {\n " + name + "\n}"))
		if err != nil {
			require.NotContains(t, err.Error(), "unknown subdirective", name)
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "config.md"))
	require.NoError(t, err)
	syntax := string(doc)
	syntax = syntax[strings.Index(syntax, "webhook_idempotency [<matcher>] {"):]
	syntax = syntax[:strings.Index(syntax, "```")]
	for _, line := range strings.Split(syntax, "\n")[1:] {
		if len(line) < 2 || line[0] != '\t' || line[1] == '\t' || line[1] == '}' || line[1] == '<' {
			continue // nested blocks, the end, placeholders
		}
		name := strings.Fields(line)[0]
		require.Contains(t, known, name, "the syntax's %s", name)
	}
}
