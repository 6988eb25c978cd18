#!/usr/bin/env bash
# Runs the benchmark harness (benches/relay.rs) against private PostgreSQL,
# MariaDB and RabbitMQ on loopback: prints the table, writes target/outboxd-bench.json.
# `scripts/bench.sh --quick` for a smaller smoke run; `--only SECTION` for one
# section; `--repeat N` for section 7's figures as the median of N runs;
# `--published-key-index` for PostgreSQL databases with README's key index over every row.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/services.sh up)"
cargo bench --bench relay -- "$@"
