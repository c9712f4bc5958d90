package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const root = "../.."

// TestConfigPageUpToDate fails when docs/config.md differs from what the doc
// comments generate; UPDATE_DOCS=1 rewrites it (as go run ./internal/docgen does).
func TestConfigPageUpToDate(t *testing.T) {
	page, problems, err := Generate(root)
	require.NoError(t, err)
	require.Empty(t, problems, "every JSON field needs a doc comment and a Caddyfile form")
	path := filepath.Join(root, outPath)
	if os.Getenv("UPDATE_DOCS") == "1" {
		require.NoError(t, os.WriteFile(path, page, 0o644))
	}
	have, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(page), string(have), "docs/config.md is out of date: run go run ./internal/docgen")
}

// TestEveryJSONFieldDocumented: the page holds every JSON field of the
// handler (the tags of the structs reached from Handler, embedded ones
// inlined), each with its Caddyfile form, and the Caddyfile forms of the
// parser's syntax comment all belong to a field.
func TestEveryJSONFieldDocumented(t *testing.T) {
	ref, err := Build(root)
	require.NoError(t, err)
	paths := map[string]Field{}
	for _, o := range ref.Objects {
		for _, f := range o.Fields {
			paths[f.Path] = f
		}
	}
	for _, want := range []string{
		"provider", "secrets", "event_id", "event_id[].from", "storage.dsn", "storage.table", "mode",
		"deliver_to", "rate.window", "order_key", "handshake", "verify_tokens", "batch", "replay_max",
		"idempotency_key.client_header", "idempotency_key.store_4xx", "hmac.prefix", "allow_sha1",
	} {
		f, ok := paths[want]
		require.True(t, ok, "field %s missing", want)
		require.NotEmpty(t, f.Doc, want)
		require.NotEmpty(t, f.Caddyfile, want)
	}
	require.Equal(t, "secret <secret>", paths["secrets"].Caddyfile)
	// A # inside a token is not a comment (jws <member>#<path>).
	require.Contains(t, paths["event_id"].Caddyfile, "jws <member>#<path>")
	require.Equal(t, "table <name>", paths["storage.table"].Caddyfile)
	require.Equal(t, "idempotency_key", paths["idempotency_key.client"].Block)
	require.Equal(t, "duration", paths["lease"].Type)
	require.Empty(t, ref.Unmatched)
}

// TestTypesFoundWhateverTheirFile moves every config type of caddymodule
// into a file of its own, under a new name, in a copy of the module: the
// page generated from the copy is the same, since the generator parses the
// whole package rather than named files.
func TestTypesFoundWhateverTheirFile(t *testing.T) {
	want, _, err := Generate(root)
	require.NoError(t, err)

	tmp := t.TempDir()
	copyDir(t, filepath.Join(root, "internal", "eventid"), filepath.Join(tmp, "internal", "eventid"))
	src := filepath.Join(root, "caddymodule")
	dst := filepath.Join(tmp, "caddymodule")
	require.NoError(t, os.MkdirAll(dst, 0o755))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	fset := token.NewFileSet()
	var moved []ast.Decl
	n := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(src, e.Name()), nil, parser.ParseComments)
		require.NoError(t, err)
		var kept []ast.Decl
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				moved = append(moved, d)
				continue
			}
			kept = append(kept, d)
		}
		f.Decls = kept
		n++
		writeFile(t, fset, filepath.Join(dst, "f"+strings.Repeat("x", n)+".go"), f)
	}
	require.NotEmpty(t, moved)
	// One file holding every type declaration, with the imports of every file.
	all := &ast.File{Name: ast.NewIdent("caddymodule"), Decls: moved}
	var out bytes.Buffer
	out.WriteString("package caddymodule\n\nimport (\n")
	for _, imp := range importsOf(t, src) {
		out.WriteString("\t" + imp + "\n")
	}
	out.WriteString(")\n\n")
	for _, d := range all.Decls {
		require.NoError(t, printer.Fprint(&out, fset, d))
		out.WriteString("\n\n")
	}
	require.NoError(t, os.WriteFile(filepath.Join(dst, "moved_types.go"), out.Bytes(), 0o644))

	got, _, err := Generate(tmp)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(to, 0o755))
	entries, err := os.ReadDir(from)
	require.NoError(t, err)
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(to, e.Name()), b, 0o644))
	}
}

func writeFile(t *testing.T, fset *token.FileSet, path string, f *ast.File) {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, printer.Fprint(&b, fset, f))
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
}

// importsOf lists every import spec of the package's files, deduplicated.
func importsOf(t *testing.T, dir string) []string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, im := range f.Imports {
			s := im.Path.Value
			if im.Name != nil {
				s = im.Name.Name + " " + s
			}
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}
