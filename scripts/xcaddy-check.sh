#!/usr/bin/env bash
# The README's "Install with xcaddy" section, checked: xcaddy (installed from the Go
# module proxy by scripts/tools.sh) builds Caddy with this checkout, through
# the module path's root package, not yet published:
#
#	xcaddy build <caddy version of go.mod> \
#		--with github.com/webhook-idempotency/caddy-webhook-idempotency@v0.0.0=.
#
# and the binary lists the module's Caddy modules.
set -euo pipefail
cd "$(dirname "$0")/.."

module=github.com/webhook-idempotency/caddy-webhook-idempotency
tools="$(bash scripts/tools.sh xcaddy)"
caddy_version="$(go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "xcaddy-check: xcaddy build $caddy_version --with $module@v0.0.0=. (in $work)"
# xcaddy makes the replacement path absolute from the current directory.
"$tools/xcaddy" build "$caddy_version" --output "$work/caddy" --with "$module@v0.0.0=." >"$work/build.log" 2>&1 || {
	cat "$work/build.log" >&2
	echo "xcaddy-check: FAIL: xcaddy build failed" >&2
	exit 1
}

"$work/caddy" version
modules="$("$work/caddy" list-modules)"
status=0
for want in http.handlers.webhook_idempotency admin.api.webhook_idempotency admin.api.webhook_idempotency_queue; do
	if grep -qx "$want" <<<"$modules"; then
		echo "xcaddy-check: ok: caddy list-modules shows $want"
	else
		echo "xcaddy-check: FAIL: caddy list-modules lacks $want" >&2
		status=1
	fi
done
if ! "$work/caddy" version | grep -q "^${caddy_version}\b"; then
	echo "xcaddy-check: FAIL: built Caddy is not $caddy_version (go.mod)" >&2
	status=1
fi
exit $status
