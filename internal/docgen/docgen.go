// Command docgen writes docs/config.md, the configuration reference, from
// the doc comments of the handler's config types (every JSON field) and the
// Caddyfile syntax in the doc comments of its Caddyfile parser (each field's
// Caddyfile form). It parses every non-test file of the caddymodule package,
// whatever file a type lives in, and the module's packages those types use.
//
//	go run ./internal/docgen          # rewrite docs/config.md
//	go test ./internal/docgen         # fails when docs/config.md is out of date
package main

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
)

const (
	modulePath = "github.com/webhook-idempotency/caddy-webhook-idempotency"
	// handlerPkg holds the handler; its root config type is the one with an
	// UnmarshalCaddyfile method.
	handlerPkg = modulePath + "/caddymodule"
	outPath    = "docs/config.md"
	caddyPkg   = "github.com/caddyserver/caddy/v2"
)

//go:embed config.md.tmpl
var pageTemplate string

// caddyfileKey names the Caddyfile subdirective of the JSON fields whose
// Caddyfile spelling differs from their JSON name (keys are JSON paths;
// "[]" marks a list's items). Every other field is written as its JSON name.
var caddyfileKey = map[string]string{
	"secrets":                       "secret",
	"verify_tokens":                 "verify_token",
	"storage.backend":               "storage",
	"storage.dsn":                   "storage",
	"storage.path":                  "storage",
	"storage.table":                 "table",
	"rate.events":                   "rate",
	"rate.window":                   "rate",
	"idempotency_key.client_header": "idempotency_key.client",
	"event_id[].from":               "event_id",
	"event_id[].name":               "event_id",
}

// Field is one JSON field of the config.
type Field struct {
	Path      string // JSON path, e.g. storage.dsn or event_id[].from
	Name      string // JSON name
	Type      string // JSON type in words
	Doc       string // the field's doc comment, one paragraph per blank line
	Caddyfile string // its Caddyfile form: a line of the syntax
	Note      string // the syntax line's comment
	Block     string // the Caddyfile block it sits in ("" at the top level)
}

// Object is a config struct: the handler or one of its nested objects.
type Object struct {
	Title  string // JSON path of the field it is the value of ("" for the handler)
	GoType string
	Doc    string
	Fields []Field
}

// Reference is what the page is made of.
type Reference struct {
	Syntax  string
	Objects []Object
	// Unmatched lists the problems the test reports: JSON fields without a
	// Caddyfile form, syntax lines without a JSON field, fields without a
	// doc comment.
	Unmatched []string
}

type goPkg struct {
	path    string
	types   map[string]*ast.TypeSpec
	docs    map[string]string
	fileOf  map[string]*ast.File
	funcs   []*ast.FuncDecl
	imports map[*ast.File]map[string]string
}

type loader struct {
	root string
	fset *token.FileSet
	pkgs map[string]*goPkg
}

func (l *loader) load(importPath string) (*goPkg, error) {
	if p, ok := l.pkgs[importPath]; ok {
		return p, nil
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(importPath, modulePath), "/")
	dir := filepath.Join(l.root, filepath.FromSlash(rel))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	p := &goPkg{path: importPath, types: map[string]*ast.TypeSpec{}, docs: map[string]string{},
		fileOf: map[string]*ast.File{}, imports: map[*ast.File]map[string]string{}}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(l.fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		imps := map[string]string{}
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			name := path[strings.LastIndex(path, "/")+1:]
			if strings.HasPrefix(name, "v") && len(name) <= 3 { // .../caddy/v2
				trimmed := strings.TrimSuffix(path, "/"+name)
				name = trimmed[strings.LastIndex(trimmed, "/")+1:]
			}
			if im.Name != nil {
				name = im.Name.Name
			}
			imps[name] = path
		}
		p.imports[f] = imps
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				if d.Tok != token.TYPE {
					continue
				}
				for _, s := range d.Specs {
					ts := s.(*ast.TypeSpec)
					doc := ts.Doc
					if doc == nil && len(d.Specs) == 1 {
						doc = d.Doc
					}
					p.types[ts.Name.Name] = ts
					p.docs[ts.Name.Name] = doc.Text()
					p.fileOf[ts.Name.Name] = f
				}
			case *ast.FuncDecl:
				p.funcs = append(p.funcs, d)
			}
		}
	}
	l.pkgs[importPath] = p
	return p, nil
}

// Build reads the module at root and returns the reference.
func Build(root string) (*Reference, error) {
	l := &loader{root: root, fset: token.NewFileSet(), pkgs: map[string]*goPkg{}}
	p, err := l.load(handlerPkg)
	if err != nil {
		return nil, err
	}
	var rootType string
	var syntaxDocs []string // UnmarshalCaddyfile's first, then the other parsers'
	for _, fn := range p.funcs {
		if fn.Recv != nil && fn.Name.Name == "UnmarshalCaddyfile" {
			rootType = recvName(fn)
			syntaxDocs = append([]string{fn.Doc.Text()}, syntaxDocs...)
		} else if strings.HasPrefix(strings.ToLower(fn.Name.Name), "unmarshal") && fn.Doc != nil {
			syntaxDocs = append(syntaxDocs, fn.Doc.Text())
		}
	}
	if rootType == "" {
		return nil, errors.New("no type with an UnmarshalCaddyfile method in " + handlerPkg)
	}
	syntax, forms := parseSyntax(syntaxDocs)

	ref := &Reference{Syntax: syntax}
	w := walker{l: l, forms: forms, used: map[string]bool{}, ref: ref, seen: map[string]bool{}, titles: map[string]string{}}
	w.queue = append(w.queue, pending{pkg: p, name: rootType})
	for len(w.queue) > 0 {
		next := w.queue[0]
		w.queue = w.queue[1:]
		key := next.pkg.path + "." + next.name
		if w.seen[key] {
			continue
		}
		w.seen[key] = true
		obj := Object{Title: next.title, GoType: next.name, Doc: paragraphs(next.pkg.docs[next.name])}
		if err := w.fields(next.pkg, next.name, next.prefix, &obj); err != nil {
			return nil, err
		}
		ref.Objects = append(ref.Objects, obj)
	}
	for k := range forms {
		if !w.used[k] && !strings.HasPrefix(k, "provider.") { // provider { } overrides are hmac's fields
			ref.Unmatched = append(ref.Unmatched, "Caddyfile subdirective "+k+" has no JSON field")
		}
	}
	sort.Strings(ref.Unmatched)
	return ref, nil
}

type pending struct {
	pkg                 *goPkg
	name, title, prefix string
}

type walker struct {
	l     *loader
	forms map[string]form
	used  map[string]bool
	ref   *Reference
	seen  map[string]bool
	queue []pending
	// titles: the JSON path each nested type is documented under.
	titles map[string]string
}

func (w *walker) fields(p *goPkg, typeName, prefix string, obj *Object) error {
	ts, ok := p.types[typeName]
	if !ok {
		return fmt.Errorf("type %s not found in %s", typeName, p.path)
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return fmt.Errorf("%s.%s is not a struct", p.path, typeName)
	}
	file := p.fileOf[typeName]
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 { // embedded: its fields sit at this level (unless tagged)
			_, nested, _ := w.typeOf(p, file, f.Type)
			if nested != nil && f.Tag == nil {
				if err := w.fields(nested.pkg, nested.name, prefix, obj); err != nil {
					return err
				}
			}
			continue
		}
		if f.Tag == nil || !ast.IsExported(f.Names[0].Name) {
			continue
		}
		tag, _ := strconv.Unquote(f.Tag.Value)
		name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		fd := Field{Path: prefix + name, Name: name, Doc: paragraphs(f.Doc.Text())}
		typ, nested, list := w.typeOf(p, file, f.Type)
		fd.Type = typ
		if fd.Doc == "" {
			w.ref.Unmatched = append(w.ref.Unmatched, "JSON field "+fd.Path+" has no doc comment")
		}
		key := caddyfileKey[fd.Path]
		if key == "" {
			key = strings.ReplaceAll(fd.Path, "[]", "")
		}
		if fm, ok := w.forms[key]; ok {
			fd.Caddyfile, fd.Note = fm.line, fm.note
			if fm.opens {
				fd.Caddyfile += " { … }"
			}
			if i := strings.LastIndex(key, "."); i >= 0 {
				fd.Block = key[:i]
			}
			w.used[key] = true
		} else if nested == nil || list {
			w.ref.Unmatched = append(w.ref.Unmatched, "JSON field "+fd.Path+" has no Caddyfile form (add it to UnmarshalCaddyfile's syntax comment, or to caddyfileKey)")
		}
		if nested != nil {
			sub := fd.Path + "."
			if list {
				sub = fd.Path + "[]."
			}
			tk := nested.pkg.path + "." + nested.name
			if w.titles[tk] == "" {
				w.titles[tk] = fd.Path
				w.queue = append(w.queue, pending{pkg: nested.pkg, name: nested.name, title: fd.Path, prefix: sub})
			}
			fd.Type += fmt.Sprintf(" (see [the `%s` object](#%s-object))", w.titles[tk], anchor(w.titles[tk]))
		}
		obj.Fields = append(obj.Fields, fd)
	}
	return nil
}

type typeRef struct {
	pkg  *goPkg
	name string
}

// typeOf renders a field's type in JSON words; nested is the struct type
// documented as an object of its own, list whether the field is a list of it.
func (w *walker) typeOf(p *goPkg, file *ast.File, e ast.Expr) (text string, nested *typeRef, list bool) {
	switch t := e.(type) {
	case *ast.StarExpr:
		return w.typeOf(p, file, t.X)
	case *ast.ArrayType:
		s, n, _ := w.typeOf(p, file, t.Elt)
		return "list of " + plural(s), n, n != nil
	case *ast.Ident:
		switch t.Name {
		case "string":
			return "string", nil, false
		case "bool":
			return "boolean", nil, false
		case "int", "int64", "int32", "uint", "uint64":
			return "integer", nil, false
		case "float64":
			return "number", nil, false
		}
		return w.named(p, t.Name)
	case *ast.SelectorExpr:
		x, _ := t.X.(*ast.Ident)
		if x == nil {
			return "value", nil, false
		}
		path := p.imports[file][x.Name]
		if path == caddyPkg && t.Sel.Name == "Duration" {
			return "duration", nil, false
		}
		if strings.HasPrefix(path, modulePath) {
			q, err := w.l.load(path)
			if err == nil {
				return w.named(q, t.Sel.Name)
			}
		}
		return "value", nil, false
	}
	return "value", nil, false
}

func (w *walker) named(p *goPkg, name string) (string, *typeRef, bool) {
	ts, ok := p.types[name]
	if !ok {
		return "value", nil, false
	}
	if _, ok := ts.Type.(*ast.StructType); ok {
		return "object", &typeRef{pkg: p, name: name}, false
	}
	return w.typeOf(p, p.fileOf[name], ts.Type)
}

// anchor is the heading anchor GitHub gives "`path` object".
func anchor(path string) string {
	return strings.NewReplacer(".", "", "[", "", "]", "", "_", "_").Replace(path)
}

func plural(s string) string {
	switch s {
	case "string", "duration", "integer", "boolean", "number":
		return s + "s"
	}
	if rest, ok := strings.CutPrefix(s, "object"); ok {
		return "objects" + rest
	}
	return s
}

func recvName(fn *ast.FuncDecl) string {
	t := fn.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// paragraphs joins a doc comment's lines into paragraphs.
func paragraphs(doc string) string {
	var out []string
	for _, para := range strings.Split(strings.TrimSpace(doc), "\n\n") {
		out = append(out, strings.Join(strings.Fields(para), " "))
	}
	return strings.TrimSpace(strings.Join(out, "\n\n"))
}

type form struct {
	line, note string
	opens      bool // the subdirective takes a block
}

var spaces = regexp.MustCompile(`\s+`)

// parseSyntax reads the indented syntax blocks of the parsers' doc comments:
// the first (UnmarshalCaddyfile's) is the page's syntax block; every line of
// every block gives the Caddyfile form of its subdirective, keyed by its
// first word and the blocks it sits in (idempotency_key.header); a form
// found in an earlier block wins.
func parseSyntax(docs []string) (string, map[string]form) {
	forms := map[string]form{}
	var first string
	for i, doc := range docs {
		var block []string
		for _, line := range strings.Split(doc, "\n") {
			if strings.HasPrefix(line, "\t") {
				block = append(block, strings.TrimPrefix(line, "\t"))
			}
		}
		if len(block) == 0 {
			continue
		}
		if i == 0 {
			first = strings.Join(block, "\n")
		}
		var stack []string
		base := 0
		if strings.HasSuffix(strings.TrimSpace(block[0]), "{") && strings.HasPrefix(block[0], "webhook_idempotency") {
			base = 1 // the directive's own block
		}
		for j, line := range block {
			if j == 0 && base == 1 {
				continue
			}
			trimmed := strings.TrimSpace(line)
			// A comment starts a token, as in a Caddyfile: "jws <member>#<path>"
			// holds no comment.
			code, note, _ := strings.Cut(" "+trimmed, " #")
			code = strings.TrimSpace(code)
			if code == "" || strings.HasPrefix(code, "}") {
				if len(stack) > 0 && strings.HasPrefix(code, "}") {
					stack = stack[:len(stack)-1]
				}
				continue
			}
			word, _, _ := strings.Cut(code, " ")
			depth := len(line) - len(strings.TrimLeft(line, "\t")) - base
			if depth < 0 {
				continue
			}
			if depth < len(stack) {
				stack = stack[:depth]
			}
			opens := strings.HasSuffix(code, "{")
			if !strings.HasPrefix(word, "<") {
				key := strings.Join(append(append([]string{}, stack...), word), ".")
				if _, ok := forms[key]; !ok {
					c := strings.TrimSpace(strings.TrimSuffix(strings.TrimSuffix(code, "[{"), "{"))
					forms[key] = form{line: spaces.ReplaceAllString(c, " "), note: strings.TrimSpace(note), opens: opens}
				}
			}
			if opens {
				stack = append(stack, word)
			}
		}
	}
	return first, forms
}

// Render writes the page.
func Render(ref *Reference) ([]byte, error) {
	var body strings.Builder
	for _, o := range ref.Objects {
		if o.Title == "" {
			body.WriteString("## Handler fields\n\n")
		} else {
			fmt.Fprintf(&body, "## `%s` object\n\n", o.Title)
		}
		if o.Doc != "" && o.Title != "" { // the handler's own doc speaks of Go, not of the config
			body.WriteString(o.Doc + "\n\n")
		}
		for _, f := range o.Fields {
			fmt.Fprintf(&body, "### `%s`\n\n", f.Path)
			fmt.Fprintf(&body, "- JSON: `\"%s\"`, %s\n", f.Name, f.Type)
			if f.Caddyfile != "" {
				where := ""
				if f.Block != "" {
					where = fmt.Sprintf(" (inside `%s { }`)", f.Block)
				}
				note := ""
				if f.Note != "" {
					note = ": " + f.Note
				}
				fmt.Fprintf(&body, "- Caddyfile: `%s`%s%s\n", f.Caddyfile, where, note)
			} else {
				fmt.Fprintf(&body, "- Caddyfile: the fields below, written as shown there\n")
			}
			fmt.Fprintf(&body, "\n%s\n\n", f.Doc)
		}
	}
	t, err := template.New("page").Parse(pageTemplate)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = t.Execute(&out, map[string]string{"Syntax": ref.Syntax, "Reference": strings.TrimSpace(body.String())})
	return out.Bytes(), err
}

// Generate builds and renders the page for the module at root.
func Generate(root string) ([]byte, []string, error) {
	ref, err := Build(root)
	if err != nil {
		return nil, nil, err
	}
	page, err := Render(ref)
	return page, ref.Unmatched, err
}

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	page, problems, err := Generate(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, "docgen:", p)
	}
	if err := os.WriteFile(filepath.Join(root, outPath), page, 0o644); err != nil { //nolint:gosec // a documentation page
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}
