#!/usr/bin/env bash
# Runs the whole test suite against private PostgreSQL and RabbitMQ on
# loopback (started, and installed if missing, by scripts/services.sh).
# Extra arguments go to the test runner, e.g. `scripts/test.sh relay`.
set -euo pipefail
cd "$(dirname "$0")/.."

eval "$(bash scripts/services.sh up)"

# Each test creates its own database named t_<random>; drop those of earlier runs.
pg_bin=${OUTBOXD_PG_BIN:-/usr/lib/postgresql/15/bin}
[ -x "$pg_bin/psql" ] || pg_bin=$(dirname "$(command -v psql)")
PGPASSWORD=outboxd "$pg_bin/psql" -q -h 127.0.0.1 -p "${OUTBOXD_PG_PORT:-55432}" -U outboxd -d postgres -tA \
  -c "SELECT format('DROP DATABASE IF EXISTS %I;', datname) FROM pg_database WHERE datname LIKE 't\_%'" \
  | PGPASSWORD=outboxd "$pg_bin/psql" -q -h 127.0.0.1 -p "${OUTBOXD_PG_PORT:-55432}" -U outboxd -d postgres >/dev/null

# Failures print their message; set RUST_BACKTRACE=1 for backtraces.
export RUST_BACKTRACE=${RUST_BACKTRACE:-0}
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
