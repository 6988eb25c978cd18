#!/usr/bin/env bash
# Runs the whole test suite against private PostgreSQL, MariaDB and RabbitMQ
# on loopback (started, and installed if missing, by scripts/services.sh). The
# multi-host tests make network namespaces (scripts/hosts.sh): root. Extra
# arguments go to the test runner, e.g. `scripts/test.sh relay`;
# `scripts/test.sh --profile full` runs the variants the default run leaves
# out (.config/nextest.toml). OUTBOXD_LONG_FAULTS=1 / OUTBOXD_LONG_HOSTS=1 /
# OUTBOXD_LONG_SOAK=1 run the long scenarios; `scripts/test.sh --run-ignored
# only -E 'binary(upgrade)'` the rolling upgrade from the previous release (it
# builds that release). `scripts/test.sh --prepare` only installs and starts
# what the tests need (CI runs it beside the lints' build: on a fresh machine
# it is minutes of downloads).
set -euo pipefail
cd "$(dirname "$0")/.."

prepare_only=false
if [ "${1:-}" = --prepare ]; then
  prepare_only=true
  shift
fi

eval "$(bash scripts/services.sh up)"

# The dashboard's browser test: Debian's Chromium, Node.js, and the pinned
# playwright-core from tests/browser/package-lock.json (no browser download).
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs npm)
# The multi-host tests (tests/hosts.rs, tests/cluster.rs): scripts/hosts.sh.
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# The clock-skew fault scenario (tests/faults.rs): libfaketime.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || need+=(faketime)
# The package test (tests/package.rs): dpkg -i needs the package's dependency.
command -v adduser >/dev/null 2>&1 || need+=(adduser)
command -v python3 >/dev/null 2>&1 || need+=(python3)
# The alert rules' checks and unit tests (tests/deploy.rs): promtool, from
# Debian's prometheus package (whose server a policy-rc.d keeps from starting).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The image test (tests/package.rs): buildah builds and runs the image.
command -v buildah >/dev/null 2>&1 || need+=(buildah)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "test.sh: apt-get install ${need[*]}" >&2
    apt-get update -qq >&2
    policy=/usr/sbin/policy-rc.d guard=""
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && guard=1
    fi
    installed=0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 || installed=$?
    [ -z "$guard" ] || rm -f "$policy"
    [ "$installed" = 0 ] || exit "$installed"
  else
    echo "test.sh: missing ${need[*]}; install them (the tests need them)" >&2
  fi
fi
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
[ "$prepare_only" = false ] || exit 0

# Test hosts left behind by a run that was killed (a passing or failing test
# removes its own).
bash scripts/hosts.sh sweep
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^oxsvc_' || true); do
  ip netns pids "$ns" | xargs -r kill -KILL
  ip netns del "$ns"
done
# The small disks (tmpfs) the fault tests fill, left mounted by a killed run:
# each holds up to a GiB of memory.
for disk in $(awk -v under="$OUTBOXD_STATE_DIR/disk-" 'index($2, under) == 1 { print $2 }' /proc/mounts); do
  umount -l "$disk" && rmdir "$disk" || true
done

# Each test creates its own database named t_<random>; drop those of earlier runs.
pg_bin=${OUTBOXD_PG_BIN:-/usr/lib/postgresql/15/bin}
[ -x "$pg_bin/psql" ] || pg_bin=$(dirname "$(command -v psql)")
PGPASSWORD=outboxd "$pg_bin/psql" -q -h 127.0.0.1 -p "${OUTBOXD_PG_PORT:-55432}" -U outboxd -d postgres -tA \
  -c "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE);', datname) FROM pg_database WHERE datname LIKE 't\_%'" \
  | PGPASSWORD=outboxd "$pg_bin/psql" -q -h 127.0.0.1 -p "${OUTBOXD_PG_PORT:-55432}" -U outboxd -d postgres >/dev/null
mysql_cli=(mariadb --no-defaults -h 127.0.0.1 -P "${OUTBOXD_MYSQL_PORT:-53306}" -u outboxd -poutboxd)
"${mysql_cli[@]}" -N -e "SELECT CONCAT('DROP DATABASE IF EXISTS \`', SCHEMA_NAME, '\`;')
  FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE 't\\_%'" | "${mysql_cli[@]}"

# Failures print their message; set RUST_BACKTRACE=1 for backtraces.
# SQLite test files of earlier runs (a failed test keeps its file).
rm -rf "${TMPDIR:-/tmp}/outboxd-sqlite-tests"
export RUST_BACKTRACE=${RUST_BACKTRACE:-0}
# `--features services`: the tests that need the services started above
# (without it they are listed as ignored: the contributor's `cargo test`).
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast --features services "$@"
else
  # Without nextest, one test at a time: the fleet tests time heartbeats.
  cargo test --workspace --no-fail-fast --features services "$@" -- --test-threads=1
fi
