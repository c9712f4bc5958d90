#!/usr/bin/env bash
# The gateway behind a real PgBouncer in transaction pooling (internal/e2e,
# TestPgBouncer*): gateways starting together, a duplicate storm, the async
# queue, with 4 server connections per database, with and without
# server_round_robin. The tests start their own PgBouncer processes on free
# ports of 127.0.0.1 in front of TEST_DATABASE_URL's server, never touching
# a PgBouncer the machine runs. Installs Debian's pgbouncer first when
# missing (needs root and apt-get). Run by scripts/test.sh as a step of its
# own; extra arguments go to go test.
set -euo pipefail
cd "$(dirname "$0")/.."

TEST_DATABASE_URL="${TEST_DATABASE_URL:-$(bash scripts/postgres.sh)}"

pgbouncer="$(command -v pgbouncer || true)"
if [ -z "$pgbouncer" ] && [ -x /usr/sbin/pgbouncer ]; then
	pgbouncer=/usr/sbin/pgbouncer
fi
if [ -z "$pgbouncer" ]; then
	if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "pgbouncer.sh: pgbouncer is missing; install it (apt-get install pgbouncer, needs root)." >&2
		exit 1
	fi
	echo "pgbouncer.sh: installing pgbouncer" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq pgbouncer >&2
	pgbouncer=/usr/sbin/pgbouncer
fi
echo "pgbouncer.sh: $("$pgbouncer" --version | head -1)" >&2

export TEST_DATABASE_URL PGBOUNCER="$pgbouncer" WEBHOOK_IDEMPOTENCY_PGBOUNCER=1
go test -race -count=1 -timeout 15m -v -run '^TestPgBouncer' ./internal/e2e/ "$@"
