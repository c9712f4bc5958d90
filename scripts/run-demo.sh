#!/usr/bin/env bash
# `make run`: the demo legacy upstream on 127.0.0.1:9000 and the gateway on
# http://127.0.0.1:8080/webhooks/stripe with the embedded default storage.
# Ctrl-C stops both. Then, in another terminal: make demo
# UPSTREAM_DELAY=2s makes the upstream take 2 s per event (to see 409s).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${STRIPE_WEBHOOK_SECRET:=whsec_demo_not_a_real_secret}"
export STRIPE_WEBHOOK_SECRET

go build -o bin/upstream ./examples/upstream
bin/upstream -listen 127.0.0.1:9000 -delay "${UPSTREAM_DELAY:-0s}" &
up=$!
trap 'kill $up 2>/dev/null || true' EXIT INT TERM

echo "gateway: http://127.0.0.1:8080/webhooks/stripe  (secret from \$STRIPE_WEBHOOK_SECRET; its value is never printed)"
echo "in another terminal:  make demo   (delivers one event five times; the upstream counts one)"
bin/caddy run --config examples/demo.Caddyfile --adapter caddyfile
