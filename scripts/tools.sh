#!/usr/bin/env bash
# Installs the project's pinned tools from the Go module proxy into bin/tools
# (once; again when the pinned version changes) and prints that directory.
#
#	bash scripts/tools.sh            # every tool
#	bash scripts/tools.sh xcaddy     # one
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned versions. golangci-lint must be built by a Go at least as new as
# the code it checks: v2.15 builds with the toolchain this repository asks for.
XCADDY_VERSION=v0.4.5
GOLANGCI_LINT_VERSION=v2.15.0

bindir="$PWD/bin/tools"
mkdir -p "$bindir"

install() { # name package version
	local stamp="$bindir/.$1.version"
	if [ -x "$bindir/$1" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$3" ]; then
		return
	fi
	echo "tools.sh: go install $2@$3 -> bin/tools" >&2
	GOBIN="$bindir" go install "$2@$3"
	echo "$3" >"$stamp"
}

want="${1:-all}"
if [ "$want" = all ] || [ "$want" = xcaddy ]; then
	install xcaddy github.com/caddyserver/xcaddy/cmd/xcaddy "$XCADDY_VERSION"
fi
if [ "$want" = all ] || [ "$want" = golangci-lint ]; then
	install golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint "$GOLANGCI_LINT_VERSION"
fi
echo "$bindir"
