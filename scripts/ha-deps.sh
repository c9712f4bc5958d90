#!/usr/bin/env bash
# Installs what the failover tests need (internal/e2e, RELIABILITY.md):
# pg_auto_failover for the PostgreSQL major version installed here, from
# Debian's packages (postgresql-<major>-auto-failover, which brings
# pg_autoctl). Idempotent: does nothing when pg_autoctl is already there.
# Prints the PostgreSQL bin directory (initdb, pg_ctl, pg_basebackup) on stdout.
set -euo pipefail

bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)"
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
	echo "ha-deps.sh: PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin." >&2
	echo "  On Debian/Ubuntu: apt-get update && apt-get install -y postgresql" >&2
	exit 1
fi
major="$(basename "$(dirname "$bindir")")"

if ! command -v pg_autoctl >/dev/null 2>&1; then
	if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "ha-deps.sh: pg_autoctl is missing; install postgresql-$major-auto-failover (needs root and apt-get)." >&2
		exit 1
	fi
	echo "ha-deps.sh: installing postgresql-$major-auto-failover" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq "postgresql-$major-auto-failover" >&2
fi
echo "$bindir"
