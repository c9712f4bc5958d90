package store

import (
	"fmt"
	"regexp"
	"strings"
)

// DefaultTable is the events table when the configuration names none, in
// every backend. The async queue's tables are named after it.
const DefaultTable = "webhook_events"

// MaxTableLen is the most bytes of a table name (without its schema): it
// leaves room for the longest derived name, <table>_secrets_goose_version,
// within PostgreSQL's 63-byte identifier limit.
const MaxTableLen = 40

// maxSchemaLen is PostgreSQL's identifier limit.
const maxSchemaLen = 63

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Table is a validated events table name: lowercase SQL identifiers that
// need no quoting rules beyond double quotes.
type Table struct {
	// Schema is "" when the name is not schema-qualified.
	Schema string
	// Name is the table itself, at most MaxTableLen bytes.
	Name string
}

// ParseTable validates an events table name, "table" or "schema.table",
// each part a lowercase SQL identifier ([a-z_][a-z0-9_]*), the table at most
// MaxTableLen bytes; "" means DefaultTable. The error never repeats more
// than the name.
func ParseTable(name string) (Table, error) {
	if name == "" {
		name = DefaultTable
	}
	schema, table, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, table = "", name
	}
	if !identRE.MatchString(table) || len(table) > MaxTableLen ||
		(qualified && (!identRE.MatchString(schema) || len(schema) > maxSchemaLen)) {
		return Table{}, fmt.Errorf("invalid table name %q: want [schema.]table, lowercase letters, digits and underscores, the table at most %d bytes", name, MaxTableLen)
	}
	return Table{Schema: schema, Name: table}, nil
}

// String is the name as configured: "schema.table" or "table".
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// Suffixed is the table named t.Name+suffix in the same schema, for the
// tables and indexes derived from the events table.
func (t Table) Suffixed(suffix string) Table {
	return Table{Schema: t.Schema, Name: t.Name + suffix}
}
