#!/usr/bin/env bash
# The demo: private PostgreSQL and RabbitMQ, the schema, a producer writing
# orders for 200 keys, a fleet of DEMO_WORKERS relay workers (default 3)
# sharing the 16 buckets through leases, and a consumer that checks per-key
# order, with the dashboard on http://127.0.0.1:8080/outbox/ (DEMO_UI=ADDR
# to change). Runs until Ctrl-C (or for DEMO_SECONDS seconds when set).
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(bash scripts/services.sh up)"
echo "building outboxd (release)..." >&2
cargo build --release --quiet
bin=target/release/outboxd
queue=outboxd-demo

$bin migrate
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# Process substitution keeps $! the outboxd process (not the prefixing sed),
# so the cleanup signals reach the processes that must stop cleanly.
$bin produce --queue "$queue" --keys 200 --rate "${DEMO_RATE:-300}" --tasks 4 > >(sed -u 's/^/[producer] /') &
pids+=($!)
$bin consume --queue "$queue" > >(sed -u 's/^/[consumer] /') &
pids+=($!)
ui=${DEMO_UI:-127.0.0.1:8080}
for i in $(seq 1 "${DEMO_WORKERS:-3}"); do
  # The first worker also serves the dashboard (it shows the whole fleet).
  ui_flag=()
  [ "$i" = 1 ] && ui_flag=(--ui "$ui")
  $bin work --window 5 "${ui_flag[@]}" > >(sed -u "s/^/[worker $i] /") &
  pids+=($!)
done

echo "demo running: producer -> outbox table -> ${DEMO_WORKERS:-3} outboxd workers -> RabbitMQ queue '$queue' -> checking consumer." >&2
echo "dashboard: http://$ui/outbox/   (Ctrl-C stops everything)" >&2
if [ -n "${DEMO_SECONDS:-}" ]; then
  sleep "$DEMO_SECONDS"
else
  wait
fi
