#!/usr/bin/env bash
# The project's whole test run: what `make test` and CI execute.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1; then
	echo "test.sh: Go is not installed (need go 1.26+ on PATH)" >&2
	exit 1
fi

TEST_DATABASE_URL="$(bash scripts/postgres.sh)"
export TEST_DATABASE_URL

echo "== gofmt / go vet"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
	echo "gofmt needed on:" >&2
	echo "$unformatted" >&2
	exit 1
fi
go vet ./...

echo "== go build ./xcaddy"
go build -o bin/caddy ./xcaddy

echo "== go test -race ./... (PostgreSQL: ${TEST_DATABASE_URL%%\?*})"
go test -race -count=1 -timeout 20m ./...

# PostgreSQL stopped, restarted and failed over under load: on temporary
# clusters the tests create (initdb in a temp directory, free ports, the
# postgres user), never the machine's server; in a step of their own because
# they are slow and timing-sensitive (internal/e2e, RELIABILITY.md).
echo "== go test: PostgreSQL restart and failover under load (temporary clusters)"
PG_BINDIR="$(bash scripts/ha-deps.sh)"
export PG_BINDIR
WEBHOOK_IDEMPOTENCY_DISRUPTIVE=1 go test -race -count=1 -timeout 15m -v \
	-run '^(TestPostgresRestartUnderLoad|TestFailover.*)$' ./internal/e2e/

echo "== short fuzz runs"
bash scripts/fuzz.sh 1500x
