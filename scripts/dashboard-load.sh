#!/usr/bin/env bash
# Measures the dashboard's API latency with a large outbox: seeds ROWS rows
# (default 1,000,000: 49% published, 50% pending over 16 buckets, 1% parked)
# into a scratch database, serves `outboxd ui`, and times every endpoint
# (REPEAT calls each; prints median and max). A measurement, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${ROWS:-1000000}
repeat=${REPEAT:-20}
eval "$(bash scripts/services.sh up)"
cargo build --release --quiet
bin=target/release/outboxd
pg_bin=${OUTBOXD_PG_BIN:-/usr/lib/postgresql/15/bin}
psql() { PGPASSWORD=outboxd "$pg_bin/psql" -q -h 127.0.0.1 -p "${OUTBOXD_PG_PORT:-55432}" -U outboxd -v ON_ERROR_STOP=1 "$@"; }
db=outboxd_load
url="postgres://outboxd:outboxd@127.0.0.1:${OUTBOXD_PG_PORT:-55432}/$db"

psql -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
DATABASE_URL=$url $bin migrate >/dev/null
echo "seeding $rows rows..." >&2
start=$(date +%s)
psql -d $db <<SQL
INSERT INTO outbox (partition_key, message_key, routing_key, payload, headers, created_at, published_at, failed_at, attempts, last_error)
SELECT 'p' || lpad((g % 16)::text, 2, '0'), 'order-' || (g % 50000), 'orders', convert_to(repeat('x', 200), 'UTF8'),
       '{"tenant":"acme"}', now() - make_interval(secs => ($rows - g) / 100.0),
       CASE WHEN g % 100 < 49 THEN now() END,
       CASE WHEN g % 100 = 99 THEN now() END,
       CASE WHEN g % 100 = 99 THEN 5 ELSE 0 END,
       CASE WHEN g % 100 = 99 THEN 'unroutable: returned by the broker (312 NO_ROUTE)' END
FROM generate_series(1, $rows) g;
INSERT INTO outbox_throughput (minute, published, failed)
SELECT date_trunc('minute', now()) - make_interval(mins => m), 5000 + m * 10, m % 7 FROM generate_series(0, 59) m;
VACUUM ANALYZE outbox;
SQL
echo "seeded in $(( $(date +%s) - start ))s: $(psql -d $db -tAc "SELECT count(*) FILTER (WHERE published_at IS NOT NULL) || ' published, ' || count(*) FILTER (WHERE published_at IS NULL AND failed_at IS NULL) || ' pending, ' || count(*) FILTER (WHERE failed_at IS NOT NULL) || ' parked' FROM outbox")" >&2

port=${PORT:-18080}
DATABASE_URL=$url OUTBOXD_LOG=warn $bin ui --listen 127.0.0.1:$port &
ui=$!
trap 'kill $ui 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done

printf '%-52s %10s %10s\n' endpoint median_ms max_ms
for path in /outbox/api/summary /outbox/api/workers /outbox/api/partitions /outbox/api/throughput \
    "/outbox/api/messages?state=pending" "/outbox/api/messages?state=published" "/outbox/api/messages?state=failed" \
    "/outbox/api/messages?state=published&key=order-4242" "/outbox/api/messages?state=pending&cursor=600000" \
    "/outbox/api/messages/500000" /outbox/api/lease-events /metrics /outbox/; do
  times=$(for _ in $(seq 1 "$repeat"); do curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$port$path"; done | sort -n)
  median=$(echo "$times" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] * 1000}')
  max=$(echo "$times" | tail -n 1 | awk '{print $1 * 1000}')
  printf '%-52s %10.1f %10.1f\n' "$path" "$median" "$max"
done
