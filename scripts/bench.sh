#!/usr/bin/env bash
# Runs the benchmark harness (benches/relay.rs) against private PostgreSQL,
# MariaDB and RabbitMQ on loopback: prints the table, writes target/outboxd-bench.json.
# `scripts/bench.sh --quick` for a smaller smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/services.sh up)"
cargo bench --bench relay -- "$@"
