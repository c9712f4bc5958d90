package pgschema

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// ServerGone reports whether err is one of the failover SQLSTATEs
// (serverGoneCodes).
func ServerGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && serverGoneCodes[pgErr.Code]
}

func TestPrepareFailoverTargetSessionAttrs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, dsn string
		readWrite bool // ValidateConnect checks for a read-write server
		none      bool // no ValidateConnect at all
	}{
		{"one host", "postgres://u@h1:5432/db", false, true},
		{"one host, sslmode prefer (a fallback to the same host)", "postgres://u@h1:5432/db?sslmode=prefer", false, true},
		{"several hosts: read-write implied", "postgres://u@h1:5432,h2:5433/db?sslmode=disable", true, false},
		{"several hosts, key=value form", "host=h1,h2 port=5432,5433 dbname=db", true, false},
		{"several hosts, read-write explicit", "postgres://u@h1,h2/db?target_session_attrs=read-write", true, false},
		{"several hosts, any kept", "postgres://u@h1,h2/db?target_session_attrs=any", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig(tc.dsn)
			require.NoError(t, err)
			PrepareFailover(cfg, tc.dsn)
			v := cfg.ConnConfig.ValidateConnect
			require.Equal(t, tc.none, v == nil)
			if tc.readWrite {
				require.Equal(t, fmt.Sprintf("%p", pgconn.ValidateConnectTargetSessionAttrsReadWrite), fmt.Sprintf("%p", v))
			}
		})
	}
}

func TestPrepareFailoverClosesOnServerGone(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://u@h1/db")
	require.NoError(t, err)
	PrepareFailover(cfg, "postgres://u@h1/db")
	keep := cfg.ConnConfig.OnPgError
	for code, closes := range map[string]bool{
		"25006": true, "57P01": true, "57P02": true, "57P03": true,
		"23505": false, "40001": false, "57014": false,
	} {
		require.Equal(t, !closes, keep(nil, &pgconn.PgError{Severity: "ERROR", Code: code}), "SQLSTATE %s", code)
	}
	require.False(t, keep(nil, &pgconn.PgError{Severity: "FATAL", Code: "28P01"}), "a FATAL still closes")
}
