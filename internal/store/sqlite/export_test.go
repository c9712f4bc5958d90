package sqlite

import "database/sql"

// DB returns the underlying database, for the tests' PRAGMA checks.
func (s *Store) DB() *sql.DB { return s.db }
