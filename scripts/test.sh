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

echo "== golangci-lint (.golangci.yml; pinned, installed into bin/tools by scripts/tools.sh)"
"$(bash scripts/tools.sh golangci-lint)/golangci-lint" run ./...

echo "== go build ./xcaddy"
go build -o bin/caddy ./xcaddy

echo "== xcaddy build --with <this checkout> (the README's Install with xcaddy; scripts/xcaddy-check.sh)"
bash scripts/xcaddy-check.sh

echo "== go test -race ./... (PostgreSQL: ${TEST_DATABASE_URL%%\?*})"
go test -race -count=1 -timeout 20m ./...

# PostgreSQL stopped, restarted and failed over under load, on temporary
# clusters the tests create, never the machine's server; a step of its own
# because it is slow and timing-sensitive (scripts/failover.sh).
echo "== go test: PostgreSQL restart and failover under load (temporary clusters)"
bash scripts/failover.sh

# Behind a real PgBouncer in transaction pooling (installed when missing),
# started by the tests on free ports (scripts/pgbouncer.sh).
echo "== go test: behind PgBouncer in transaction pooling"
bash scripts/pgbouncer.sh

echo "== short fuzz runs"
bash scripts/fuzz.sh 1500x
