package signature

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	readmePath  = "../../README.md"
	tableBegin  = "<!-- providers:begin (generated from internal/signature presets; UPDATE_README=1 go test ./internal/signature -run TestREADMEProviderTable) -->\n"
	tableEnd    = "<!-- providers:end -->"
	updateReadm = "UPDATE_README"
)

// The README's provider table is generated from the presets: this test fails
// when they differ, and rewrites the README with UPDATE_README=1.
func TestREADMEProviderTable(t *testing.T) {
	raw, err := os.ReadFile(readmePath)
	require.NoError(t, err)
	readme := string(raw)
	i := strings.Index(readme, tableBegin)
	j := strings.Index(readme, tableEnd)
	require.True(t, i >= 0 && j > i, "README.md lacks the provider table markers")
	want := MarkdownTable()
	got := readme[i+len(tableBegin) : j]
	if got == want {
		return
	}
	if os.Getenv(updateReadm) == "1" {
		out := readme[:i+len(tableBegin)] + want + readme[j:]
		require.NoError(t, os.WriteFile(readmePath, []byte(out), 0o644))
		return
	}
	t.Fatalf("README.md provider table differs from the presets; run UPDATE_README=1 go test ./internal/signature -run TestREADMEProviderTable\n--- want\n%s--- got\n%s", want, got)
}
