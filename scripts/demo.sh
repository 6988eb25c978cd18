#!/usr/bin/env bash
# The demo: private PostgreSQL (or MariaDB with DEMO_DB=mariadb, or an
# SQLite file with DEMO_DB=sqlite) and RabbitMQ, the schema, a producer writing
# orders for 200 keys, a fleet of DEMO_WORKERS relay workers (default 3)
# sharing the 16 buckets through leases, and a consumer that checks per-key
# order, with the dashboard on http://127.0.0.1:8080/outbox/ (DEMO_UI=ADDR
# to change). Runs until Ctrl-C (or for DEMO_SECONDS seconds when set).
# On the way out the producer stops first; the fleet publishes what it
# wrote and the consumer reads it before they stop, so the final counts of
# producer and consumer agree.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${DEMO_DB:-postgres}" in
  postgres) eval "$(bash scripts/services.sh up)" ;;
  mariadb | mysql) eval "$(bash scripts/services.sh up)"; export DATABASE_URL=$OUTBOXD_MYSQL_URL ;;
  # One file beside the other demo state; RabbitMQ is the only service.
  sqlite)
    eval "$(bash scripts/services.sh broker)"
    export DATABASE_URL="sqlite://$OUTBOXD_STATE_DIR/demo.db"
    ;;
  *) echo "demo: DEMO_DB is postgres, mariadb or sqlite, not '$DEMO_DB'" >&2; exit 2 ;;
esac
echo "building outboxd (release; the first build takes a few minutes)..." >&2
cargo build --release --quiet
bin=target/release/outboxd
queue=outboxd-demo

$bin migrate
# Messages an earlier run left in the queue would count against this run's
# order check.
bash scripts/services.sh rabbit ctl "$OUTBOXD_STATE_DIR/rabbit" "${OUTBOXD_AMQP_PORT:-55672}" \
  -q purge_queue "$queue" >/dev/null 2>&1 || true
producer="" consumer="" workers=()

# From status's first line: "workers 3 live | buckets 16/16 owned | pending 10 | …".
pending() { $bin status 2>/dev/null | head -n 1 | sed -n 's/.*| pending \([0-9]*\) |.*/\1/p' | grep . || echo "?"; }

stop() {
  trap - EXIT INT TERM
  echo "demo: stopping the producer; waiting for the fleet to publish what it wrote..." >&2
  [ -z "$producer" ] || { kill -TERM "$producer" 2>/dev/null || true; wait "$producer" 2>/dev/null || true; }
  local left="?" i
  for i in $(seq 1 60); do
    left=$(pending)
    [ "$left" = 0 ] && break
    sleep 0.5
  done
  sleep 1 # the last confirmed messages reach the consumer
  [ -z "$consumer" ] || { kill -TERM "$consumer" 2>/dev/null || true; wait "$consumer" 2>/dev/null || true; }
  for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$left" = 0 ]; then
    echo "demo: stopped; every produced message was published and consumed (see the totals above)" >&2
  else
    echo "demo: stopped with $left message(s) still pending in the outbox (published by the next run)" >&2
  fi
  if [ "${DEMO_DB:-postgres}" = sqlite ]; then
    echo "demo: still running: the private RabbitMQ (state and demo.db in $OUTBOXD_STATE_DIR); scripts/services.sh down stops it" >&2
  else
    echo "demo: still running: the private PostgreSQL, PgBouncer, MariaDB and RabbitMQ (state in $OUTBOXD_STATE_DIR); scripts/services.sh down stops them" >&2
  fi
}
trap stop EXIT
trap 'exit 0' INT TERM

# Each process in a session of its own, so a Ctrl-C in the terminal reaches
# only this script, which then stops them in order. Process substitution
# keeps $! the outboxd process (not the prefixing sed); log lines (stderr)
# get the same prefix as the output.
prefixed() {
  local tag=$1
  shift
  setsid "$@" > >(sed -u "s/^/[$tag] /") 2> >(sed -u "s/^/[$tag] /" >&2) &
}
prefixed producer $bin produce --queue "$queue" --keys 200 --rate "${DEMO_RATE:-300}" --tasks 4
producer=$!
prefixed consumer $bin consume --queue "$queue"
consumer=$!
ui=${DEMO_UI:-127.0.0.1:8080}
for i in $(seq 1 "${DEMO_WORKERS:-3}"); do
  # The first worker also serves the dashboard (it shows the whole fleet).
  ui_flag=()
  [ "$i" = 1 ] && ui_flag=(--ui "$ui")
  # Named as its prefix here, so the dashboard and `status` say the same.
  OUTBOXD_WORKER__NAME="worker-$i" prefixed "worker-$i" $bin work --window 5 "${ui_flag[@]}"
  workers+=($!)
done

echo "demo running: producer -> outbox table -> ${DEMO_WORKERS:-3} outboxd workers -> RabbitMQ queue '$queue' -> checking consumer." >&2
echo "dashboard: http://$ui/outbox/   (Ctrl-C stops everything)" >&2
if [ -n "${DEMO_SECONDS:-}" ]; then
  sleep "$DEMO_SECONDS"
else
  wait
fi
