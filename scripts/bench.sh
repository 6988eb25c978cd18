#!/usr/bin/env bash
# Runs the benchmark harness (benches/relay.rs) against private PostgreSQL,
# MariaDB and RabbitMQ on loopback: prints the table, writes target/outboxd-bench.json.
# `scripts/bench.sh --quick` for a smaller smoke run; `--only SECTION` for one
# section; `--repeat N` for section 7's figures as the median of N runs;
# `--published-key-index` for PostgreSQL databases with the book's key index over every row (docs/operations.md).
set -euo pipefail
cd "$(dirname "$0")/.."

# The harness's own `outboxd work` processes (their configs live in its
# /tmp/outboxd-bench-<pid>/) outlive it when it panics or is killed, and
# would join the next run's databases as extra fleet members: stop those
# whose parent is no longer a harness (`relay-<hash>`; a live run's workers
# are its children, an orphan's parent is init or a subreaper).
stop_orphaned_workers() {
    local pid parent
    for pid in $(pgrep -f '/outboxd-bench-[0-9]+/' || true); do
        parent=$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ') || continue
        if [[ "$(ps -o comm= -p "$parent" 2>/dev/null)" != relay-* ]]; then
            echo "bench: stopping orphaned worker $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
}
trap stop_orphaned_workers EXIT
trap 'exit 130' INT TERM

eval "$(bash scripts/services.sh up)"
stop_orphaned_workers
cargo bench --bench relay -- "$@"
