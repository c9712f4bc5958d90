package signature_test

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/webhook-idempotency/caddy-webhook-idempotency/internal/signature"
)

// Each preset carries the refusal status its provider documents: 400 unless
// the provider requires another. Only these do (a new one is a deliberate
// change to this list and to the provider's Doc reference).
func TestPresetRefuseStatus(t *testing.T) {
	t.Parallel()
	documented := map[string]int{
		"discord": http.StatusUnauthorized,
		"xero":    http.StatusUnauthorized,
	}
	table := signature.MarkdownTable()
	for _, name := range signature.Providers() {
		p, ok := signature.Lookup(name)
		require.True(t, ok)
		want, ok := documented[name]
		if !ok {
			want = http.StatusBadRequest
		}
		require.Equal(t, want, p.RefuseStatus, name)
		// The README's provider table shows it.
		row := ""
		for line := range strings.SplitSeq(table, "\n") {
			if strings.HasPrefix(line, "| `"+name+"` |") {
				row = line
			}
		}
		require.Equal(t, strconv.Itoa(want), tableCell(t, table, row, "refuse_status"), name)
	}
}

// tableCell returns the cell of row under the column named col of the
// Markdown table whose first line is its header.
func tableCell(t *testing.T, table, row, col string) string {
	t.Helper()
	header, _, _ := strings.Cut(table, "\n")
	names := strings.Split(strings.Trim(header, "| "), " | ")
	cells := strings.Split(strings.Trim(row, "| "), " | ")
	i := slices.Index(names, col)
	require.GreaterOrEqual(t, i, 0, "no column %q in %q", col, header)
	require.Greater(t, len(cells), i, row)
	return cells[i]
}
