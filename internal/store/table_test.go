package store_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/store"
)

func TestParseTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in  string
		want      store.Table
		wantErr   bool
		qualified string
	}{
		{name: "default", in: "", want: store.Table{Name: store.DefaultTable}, qualified: "webhook_events"},
		{name: "plain", in: "events", want: store.Table{Name: "events"}, qualified: "events"},
		{name: "schema", in: "hooks.events", want: store.Table{Schema: "hooks", Name: "events"}, qualified: "hooks.events"},
		{name: "longest", in: strings.Repeat("t", store.MaxTableLen), want: store.Table{Name: strings.Repeat("t", store.MaxTableLen)}},
		{name: "too long", in: strings.Repeat("t", store.MaxTableLen+1), wantErr: true},
		{name: "uppercase", in: "Events", wantErr: true},
		{name: "quote", in: `ev"ents`, wantErr: true},
		{name: "injection", in: "t; DROP TABLE x", wantErr: true},
		{name: "three parts", in: "a.b.c", wantErr: true},
		{name: "empty schema", in: ".events", wantErr: true},
		{name: "empty table", in: "hooks.", wantErr: true},
		{name: "digit first", in: "1events", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := store.ParseTable(tc.in)
			if tc.wantErr {
				require.ErrorContains(t, err, "invalid table name")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			if tc.qualified != "" {
				require.Equal(t, tc.qualified, got.String())
			}
		})
	}
	q, err := store.ParseTable("hooks.events")
	require.NoError(t, err)
	require.Equal(t, store.Table{Schema: "hooks", Name: "events_queue"}, q.Suffixed("_queue"))
}
