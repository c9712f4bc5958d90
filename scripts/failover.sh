#!/usr/bin/env bash
# PostgreSQL stopped, restarted and failed over under load (internal/e2e,
# RELIABILITY.md): on temporary clusters the tests create (initdb in a temp
# directory owned by the postgres user, free ports on 127.0.0.1) and remove,
# never the machine's server. Installs pg_auto_failover first when missing
# (scripts/ha-deps.sh). Run by scripts/test.sh as a step of its own, and by
# `make failover`.
set -euo pipefail
cd "$(dirname "$0")/.."

TEST_DATABASE_URL="${TEST_DATABASE_URL:-$(bash scripts/postgres.sh)}"
PG_BINDIR="$(bash scripts/ha-deps.sh)"
export TEST_DATABASE_URL PG_BINDIR
WEBHOOK_IDEMPOTENCY_DISRUPTIVE=1 go test -race -count=1 -timeout 15m -v \
	-run '^(TestPostgresRestartUnderLoad|TestFailover.*)$' ./internal/e2e/ "$@"
