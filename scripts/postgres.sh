#!/usr/bin/env bash
# Makes sure the PostgreSQL the tests use is running and reachable, and prints
# the DSN to use on stdout. Starts a stopped local cluster (pg_ctlcluster);
# says exactly what is missing when PostgreSQL is not installed.
#
#   TEST_DATABASE_URL  DSN to use (default postgres://postgres@127.0.0.1:5432/test?sslmode=disable)
set -euo pipefail

DSN="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"

ready() { pg_isready -q -d "$DSN" >/dev/null 2>&1; }

if ! command -v pg_isready >/dev/null 2>&1; then
	echo "postgres.sh: PostgreSQL client tools are not installed (pg_isready not found)." >&2
	echo "  On Debian/Ubuntu: apt-get update && apt-get install -y postgresql" >&2
	echo "  or point TEST_DATABASE_URL at a reachable server." >&2
	exit 1
fi

if ! ready; then
	if command -v pg_lsclusters >/dev/null 2>&1 && [ -n "$(pg_lsclusters -h 2>/dev/null)" ]; then
		pg_lsclusters -h | while read -r ver name _port status _rest; do
			if [ "$status" != "online" ]; then
				echo "postgres.sh: starting PostgreSQL cluster $ver/$name" >&2
				pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2 || true
			fi
		done
		for _ in $(seq 1 30); do
			ready && break
			sleep 1
		done
	else
		echo "postgres.sh: no PostgreSQL server answers at $DSN and no local cluster exists." >&2
		echo "  On Debian/Ubuntu: apt-get update && apt-get install -y postgresql" >&2
		echo "  or point TEST_DATABASE_URL at a reachable server." >&2
		exit 1
	fi
fi

if ! ready; then
	echo "postgres.sh: PostgreSQL is installed but does not accept connections at $DSN" >&2
	exit 1
fi
if ! psql "$DSN" -Atqc 'select 1' >/dev/null 2>&1; then
	echo "postgres.sh: PostgreSQL is up but refused the login in $DSN." >&2
	echo "  The tests expect trust auth for 127.0.0.1 (or set TEST_DATABASE_URL with a password)." >&2
	psql "$DSN" -Atqc 'select 1' >&2 || true
	exit 1
fi
echo "$DSN"
