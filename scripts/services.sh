#!/usr/bin/env bash
# Private PostgreSQL, PgBouncer, MariaDB and RabbitMQ on loopback for the demo, the
# tests and the benchmarks. Installs what is missing (Debian packages, with
# their system services kept from starting), keeps every byte of state under
# $OUTBOXD_STATE_DIR (default: <repo>/.outboxd), never touches a system-wide
# service.
#
#   scripts/services.sh up                 start them (idempotent); prints the env to use
#   scripts/services.sh broker             start only RabbitMQ (idempotent); prints the env
#   scripts/services.sh down               stop them (and epmd, when no other node uses it)
#   scripts/services.sh env                print DATABASE_URL / AMQP_URL exports
#   scripts/services.sh rabbit start DIR PORT   a further private broker (tests that restart one)
#   scripts/services.sh rabbit stop  DIR PORT
#   scripts/services.sh rabbit ctl   DIR PORT ARGS…  rabbitmqctl against that broker
#   scripts/services.sh pg start|stop      only PostgreSQL
#   scripts/services.sh pg standby HOST PORT   a streaming replica of HOST:PORT (pg_basebackup), started
#   scripts/services.sh pg promote         promote that replica to primary
#   scripts/services.sh pg tls-reload      new TLS files for a TLS server (see TLS below)
#   scripts/services.sh mariadb start|stop|kill   only MariaDB (kill: SIGKILL, a crash)
#   scripts/services.sh pgbouncer start|repoint DIR PORT HOST PGPORT
#                                          a PgBouncer (transaction mode) in DIR on PORT in front of
#                                          HOST:PGPORT; repoint rewrites the target and RELOADs
#   scripts/services.sh pgbouncer stop DIR
#
# Environment: OUTBOXD_STATE_DIR, OUTBOXD_PG_PORT (55432), OUTBOXD_AMQP_PORT
# (55672), OUTBOXD_PGBOUNCER_PORT (56432), OUTBOXD_MYSQL_PORT (53306),
# OUTBOXD_PG_BIN; OUTBOXD_LISTEN: the address PostgreSQL, MariaDB and a
# private broker listen on (127.0.0.1; scripts/hosts.sh gives a test
# network's address). For a RabbitMQ cluster node in a test host
# (scripts/hosts.sh): OUTBOXD_RABBIT_NODE_HOST (the node's IP, long node
# names), OUTBOXD_RABBIT_COOKIE (shared by the cluster), OUTBOXD_RABBIT_CONF
# (extra rabbitmq.conf lines). OUTBOXD_STREAM_PORT: `up` and `broker`
# enable streams (the rabbitmq_stream plugin) on this port (55552) and
# print OUTBOXD_STREAM_URL; set for `rabbit start`, a further broker gets
# them too.
#
# TLS (the TLS tests; a private server each): OUTBOXD_TLS_DIR names a folder
# holding ca.pem, server.pem and server.key (PEM, made by the test). With it,
#   pg start        serves TLS only (pg_hba: hostnossl … reject); with
#                   OUTBOXD_TLS_CLIENT=required also a client certificate
#                   signed by ca.pem (clientcert=verify-ca); with
#                   OUTBOXD_TLS_PLAIN_TOO=1 plain connections too (the bench)
#   mariadb start   serves TLS, require_secure_transport = ON
#   rabbit start    adds a TLS listener on OUTBOXD_AMQPS_PORT (verify_peer;
#                   OUTBOXD_TLS_CLIENT=required: fail_if_no_peer_cert and the
#                   EXTERNAL mechanism, the certificate's CN the user name),
#                   and a TLS stream listener on OUTBOXD_STREAM_TLS_PORT
#                   when it is set
#   pgbouncer start client_tls_sslmode = require
# and `pg tls-reload` / `rabbit tls-reload DIR PORT` take new files from it
# (certificate rotation). The files are copied into the server's state,
# readable by the service user only.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
state=${OUTBOXD_STATE_DIR:-$repo/.outboxd}
pg_port=${OUTBOXD_PG_PORT:-55432}
amqp_port=${OUTBOXD_AMQP_PORT:-55672}
stream_port=${OUTBOXD_STREAM_PORT:-55552}
bouncer_port=${OUTBOXD_PGBOUNCER_PORT:-56432}
mysql_port=${OUTBOXD_MYSQL_PORT:-53306}
listen=${OUTBOXD_LISTEN:-127.0.0.1}
node_host=${OUTBOXD_RABBIT_NODE_HOST:-}
pg_bin=${OUTBOXD_PG_BIN:-/usr/lib/postgresql/15/bin}
svc_user=outboxd-svc
# The MariaDB account the server's own socket lets in without a password
# (unix_socket authentication): the OS user the server was set up by.
if [ "$(id -u)" = 0 ]; then svc_user_or_root=$svc_user; else svc_user_or_root=$(id -un); fi

log() { echo "services: $*" >&2; }

tls_dir=${OUTBOXD_TLS_DIR:-}
tls_client=${OUTBOXD_TLS_CLIENT:-}

# Copies the TLS files into DIR (state of one server), owned by the service
# user, private (PostgreSQL refuses a key others can read).
tls_copy() {
  local dir=$1 f
  as_svc mkdir -p "$dir"
  for f in ca.pem server.pem server.key; do
    as_svc sh -c "umask 077; cat > '$dir/$f.new' && mv '$dir/$f.new' '$dir/$f'" < "$tls_dir/$f"
  done
}

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "need root to apt-get install $*; install them and run again"
    exit 1
  fi
  if [ ! -f "$state/.apt-updated" ]; then
    log "apt-get update"
    apt-get update -qq >&2
    mkdir -p "$state" && touch "$state/.apt-updated"
  fi
  log "apt-get install $*"
  # Debian starts a package's system service on install (a second RabbitMQ
  # on 5672, a PgBouncer on 6432): a policy-rc.d that says "no" prevents
  # that for the length of the install.
  local policy=/usr/sbin/policy-rc.d guard=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && guard=1
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 || rc=$?
  [ -z "$guard" ] || rm -f "$policy"
  return "$rc"
}

ensure_packages() {
  local want=()
  [ -x "$pg_bin/postgres" ] || want+=(postgresql-15)
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || want+=(rabbitmq-server)
  [ -x /usr/sbin/pgbouncer ] || want+=(pgbouncer)
  [ -x /usr/sbin/mariadbd ] || want+=(mariadb-server mariadb-client)
  if [ "${#want[@]}" -gt 0 ]; then apt_install "${want[@]}"; fi
  if [ ! -x "$pg_bin/postgres" ]; then
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -x "$pg_bin/postgres" ] || { log "no PostgreSQL server binaries found"; exit 1; }
  fi
}

# PostgreSQL refuses to run as root; RabbitMQ should not. When we are root the
# services run as a dedicated unprivileged user that owns the state directory.
as_svc() {
  if [ "$(id -u)" = 0 ]; then
    id -u "$svc_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$svc_user"
    runuser -u "$svc_user" -- env HOME="$state" "$@"
  else
    env HOME="$state" "$@"
  fi
}

# Keeps PORTs out of the kernel's choice of local ports for outgoing
# connections, in this network namespace. The default ports lie in Linux's
# ephemeral range (32768-60999), so a client socket (a readiness check, a
# pooled connection) may hold one just when a server starts on it: RabbitMQ
# then stops with "eaddrinuse" (seen once in CI). Only ports in that range,
# only as root; it lasts until reboot and changes nothing else (a server
# binds a reserved port as before).
reserve_ports() {
  local file=/proc/sys/net/ipv4/ip_local_reserved_ports
  [ "$(id -u)" = 0 ] && [ -w "$file" ] || return 0
  local lo hi p
  read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range
  (
    flock 9
    local now
    now=$(cat "$file")
    for p in "$@"; do
      [ "$p" -ge "$lo" ] && [ "$p" -le "$hi" ] || continue
      case ",$now," in *",$p,"*) ;; *) now=${now:+$now,}$p ;; esac
    done
    echo "$now" > "$file"
  ) 9>/tmp/outboxd-reserved-ports.lock
}

own_state() {
  mkdir -p "$state"
  if [ "$(id -u)" = 0 ]; then
    id -u "$svc_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$svc_user"
    chown "$svc_user" "$state"
    chmod 755 "$state"
  fi
}

pg_start() {
  local data=$state/pg
  own_state
  reserve_ports "$pg_port"
  if [ ! -f "$data/PG_VERSION" ]; then
    log "initdb $data"
    as_svc mkdir -p "$data"
    as_svc sh -c "echo outboxd > '$state/.pgpass-init'"
    as_svc "$pg_bin/initdb" -D "$data" -U outboxd --pwfile="$state/.pgpass-init" \
      --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$state/.pgpass-init"
    # Test hosts (scripts/hosts.sh) reach a server listening on their
    # network's address; it listens on loopback only otherwise.
    as_svc sh -c "echo 'host all all samenet scram-sha-256' >> '$data/pg_hba.conf'"
    if [ -n "$tls_dir" ] && [ -z "${OUTBOXD_TLS_PLAIN_TOO:-}" ]; then
      local client=""
      [ "$tls_client" != required ] || client=" clientcert=verify-ca"
      # TCP over TLS only: plain TCP is refused by the first line.
      as_svc sh -c "sed -i '/^host /d' '$data/pg_hba.conf' && printf 'hostnossl all all all reject\nhostssl all all all scram-sha-256$client\n' >> '$data/pg_hba.conf'"
    fi
  fi
  if as_svc "$pg_bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    return 0
  fi
  local tls_opts=""
  if [ -n "$tls_dir" ]; then
    tls_copy "$state/tls"
    tls_opts="-c ssl=on -c ssl_cert_file=$state/tls/server.pem -c ssl_key_file=$state/tls/server.key -c ssl_ca_file=$state/tls/ca.pem"
  fi
  as_svc mkdir -p "$state/pg-run"
  as_svc "$pg_bin/pg_ctl" -D "$data" -l "$state/pg.log" -w -t 60 start -o \
    "-c listen_addresses=$listen -c port=$pg_port -c unix_socket_directories=$state/pg-run \
     -c max_connections=300 -c shared_buffers=256MB -c fsync=on $tls_opts" >/dev/null
  if ! as_svc "$pg_bin/psql" -h "$state/pg-run" -p "$pg_port" -U outboxd -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname='outboxd'" | grep -q 1; then
    as_svc "$pg_bin/createdb" -h "$state/pg-run" -p "$pg_port" -U outboxd outboxd
  fi
  log "PostgreSQL up on $listen:$pg_port"
}

# New certificate files for a running TLS server: copied in, then a reload
# (new connections use them; established ones keep theirs).
pg_tls_reload() {
  tls_copy "$state/tls"
  as_svc "$pg_bin/pg_ctl" -D "$state/pg" reload >/dev/null
}

pg_stop() {
  [ -f "$state/pg/PG_VERSION" ] || return 0
  as_svc "$pg_bin/pg_ctl" -D "$state/pg" -m "${1:-fast}" -w stop >/dev/null 2>&1 || true
}

# A streaming replica of HOST:PORT in this state directory, started.
pg_standby() {
  local data=$state/pg
  own_state
  if [ ! -f "$data/PG_VERSION" ]; then
    log "pg_basebackup of $1:$2 into $data"
    as_svc mkdir -p "$data"
    as_svc chmod 700 "$data"
    as_svc env PGPASSWORD=outboxd "$pg_bin/pg_basebackup" -h "$1" -p "$2" -U outboxd \
      -D "$data" -R -X stream -c fast
  fi
  pg_start
}

pg_promote() {
  as_svc "$pg_bin/pg_ctl" -D "$state/pg" -w -t 60 promote >/dev/null
}

# A PgBouncer in transaction mode: every database name goes to HOST:PGPORT.
# Fewer server connections than clients, so statements of one client do
# travel over different server sessions.
pgbouncer_conf() {
  local dir=$1 port=$2 host=$3 pgport=$4
  cat <<EOF
[databases]
* = host=$host port=$pgport
[pgbouncer]
listen_addr = $listen
listen_port = $port
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
admin_users = outboxd
pool_mode = transaction
default_pool_size = 8
max_client_conn = 2000
ignore_startup_parameters = extra_float_digits
server_login_retry = 1
query_wait_timeout = 30
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  if [ -n "$tls_dir" ]; then
    printf 'client_tls_sslmode = require\nclient_tls_cert_file = %s\nclient_tls_key_file = %s\nclient_tls_ca_file = %s\n' \
      "$dir/tls/server.pem" "$dir/tls/server.key" "$dir/tls/ca.pem"
  fi
}

pgbouncer_admin() {
  local port=$1
  shift
  PGPASSWORD=outboxd "$pg_bin/psql" -h "$listen" -p "$port" -U outboxd -d pgbouncer -qtAc "$@"
}

pgbouncer_start() {
  local dir=$1 port=$2
  own_state
  reserve_ports "$port"
  as_svc mkdir -p "$dir"
  as_svc sh -c "echo '\"outboxd\" \"outboxd\"' > '$dir/userlist.txt'"
  [ -z "$tls_dir" ] || tls_copy "$dir/tls"
  pgbouncer_conf "$@" | as_svc sh -c "cat > '$dir/pgbouncer.ini'"
  if [ -f "$dir/pgbouncer.pid" ] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null; then
    return 0
  fi
  as_svc /usr/sbin/pgbouncer -d -q "$dir/pgbouncer.ini"
  local i
  for i in $(seq 1 50); do
    if pgbouncer_admin "$port" "SHOW VERSION" >/dev/null 2>&1; then
      log "PgBouncer up on $listen:$port -> $3:$4 ($dir)"
      return 0
    fi
    sleep 0.1
  done
  log "PgBouncer did not start; see $dir/pgbouncer.log"
  exit 1
}

pgbouncer_repoint() {
  local dir=$1 port=$2
  pgbouncer_conf "$@" | as_svc sh -c "cat > '$dir/pgbouncer.ini'"
  pgbouncer_admin "$port" "RELOAD" >/dev/null
  log "PgBouncer on $listen:$port now -> $3:$4"
}

pgbouncer_stop() {
  local dir=$1 pid i
  [ -f "$dir/pgbouncer.pid" ] || return 0
  pid=$(cat "$dir/pgbouncer.pid")
  kill "$pid" 2>/dev/null || return 0
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# MariaDB (Debian's 10.11) with its data under $state/mariadb, on its own
# port and socket; user outboxd/outboxd with every privilege (tests create
# and drop databases). The binary log is off: outboxd needs none, and
# triggers that read other tables need no SUPER privilege without it.
mariadb_start() {
  local data=$state/mariadb
  own_state
  reserve_ports "$mysql_port"
  if [ ! -d "$data/mysql" ]; then
    log "mariadb-install-db $data"
    as_svc mkdir -p "$data"
    as_svc mariadb-install-db --no-defaults --datadir="$data" --auth-root-authentication-method=socket \
      --skip-test-db >"$state/mariadb-install.log" 2>&1 || { cat "$state/mariadb-install.log" >&2; exit 1; }
  fi
  if mariadb_ping; then
    return 0
  fi
  local tls_opts=()
  if [ -n "$tls_dir" ]; then
    tls_copy "$state/tls"
    tls_opts=(--ssl-ca="$state/tls/ca.pem" --ssl-cert="$state/tls/server.pem"
      --ssl-key="$state/tls/server.key" --require-secure-transport=ON)
  fi
  as_svc setsid /usr/sbin/mariadbd --no-defaults "${tls_opts[@]}" --datadir="$data" --port="$mysql_port" \
    --bind-address="$listen" --socket="$state/mariadb.sock" --pid-file="$state/mariadb.pid" \
    --log-error="$state/mariadb.log" --skip-log-bin --innodb-buffer-pool-size=256M \
    --innodb-log-file-size=256M --max-connections=500 --max-allowed-packet=64M --character-set-server=utf8mb4 \
    --collation-server=utf8mb4_bin --default-time-zone=+00:00 --skip-name-resolve \
    >/dev/null 2>&1 </dev/null &
  local i
  for i in $(seq 1 120); do
    if mariadb_ping; then
      as_svc mariadb --no-defaults -S "$state/mariadb.sock" -u "$svc_user_or_root" -e \
        "CREATE USER IF NOT EXISTS 'outboxd'@'%' IDENTIFIED BY 'outboxd';
         GRANT ALL ON *.* TO 'outboxd'@'%' WITH GRANT OPTION;
         CREATE DATABASE IF NOT EXISTS outboxd;" >/dev/null
      log "MariaDB up on $listen:$mysql_port"
      return 0
    fi
    sleep 0.5
  done
  log "MariaDB did not start; see $state/mariadb.log"
  tail -n 30 "$state/mariadb.log" >&2 || true
  exit 1
}

mariadb_ping() {
  [ -S "$state/mariadb.sock" ] && as_svc mariadb-admin --no-defaults -S "$state/mariadb.sock" \
    -u "$svc_user_or_root" ping >/dev/null 2>&1
}

mariadb_stop() {
  [ -f "$state/mariadb.pid" ] || return 0
  local pid i
  pid=$(cat "$state/mariadb.pid")
  if [ "${1:-}" = kill ]; then
    kill -KILL "$pid" 2>/dev/null || true
  else
    kill "$pid" 2>/dev/null || true
  fi
  for i in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$state/mariadb.pid"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# One RabbitMQ node: its own node name, data, logs, cookie and ports.
node_name() {
  if [ -n "$node_host" ]; then echo "outboxd-$1@$node_host"; else echo "outboxd-$1@localhost"; fi
}

rabbit_env() {
  local dir=$1 port=$2
  if [ -n "$node_host" ]; then
    echo RABBITMQ_USE_LONGNAME=true ERL_EPMD_ADDRESS="$node_host,127.0.0.1"
  else
    echo ERL_EPMD_ADDRESS=127.0.0.1
  fi
  echo RABBITMQ_NODENAME="$(node_name "$port")" \
    RABBITMQ_NODE_IP_ADDRESS="$listen" RABBITMQ_NODE_PORT="$port" \
    RABBITMQ_DIST_PORT="$((port + 1))" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_PID_FILE="$dir/rabbit.pid" RABBITMQ_CONFIG_FILE="$dir/rabbitmq" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" HOME="$dir"
}

rabbit_ctl() {
  local dir=$1 port=$2
  shift 2
  # shellcheck disable=SC2046
  as_svc env $(rabbit_env "$dir" "$port") /usr/lib/rabbitmq/bin/rabbitmqctl -n "$(node_name "$port")" "$@"
}

rabbit_start() {
  local dir=$1 port=$2
  own_state
  reserve_ports "$port" "$((port + 1))" ${OUTBOXD_AMQPS_PORT:-}
  as_svc mkdir -p "$dir/log" "$dir/mnesia"
  # Before any CLI call, which would create a random cookie of its own.
  if [ -n "${OUTBOXD_RABBIT_COOKIE:-}" ]; then
    as_svc sh -c "rm -f '$dir/.erlang.cookie'; umask 077; printf '%s' '$OUTBOXD_RABBIT_COOKIE' > '$dir/.erlang.cookie'"
  fi
  # Running already (`up` again)? Only a node that wrote its pid file can
  # be: each rabbitmqctl call boots a VM of its own (~1 s), which a fresh
  # node's start need not pay.
  if [ -f "$dir/rabbit.pid" ] && rabbit_ctl "$dir" "$port" -q status >/dev/null 2>&1; then
    return 0
  fi
  local dist_if="127,0,0,1" ticktime=""
  # A cluster node notices a lost peer node within seconds, not a minute.
  [ -z "$node_host" ] || { dist_if=${node_host//./,}; ticktime=", {net_ticktime, 8}"; }
  local tls_conf="" plugins=()
  if [ -n "$tls_dir" ]; then
    tls_copy "$dir/tls"
    tls_conf="listeners.ssl.default = ${OUTBOXD_AMQPS_PORT:?OUTBOXD_AMQPS_PORT is needed with OUTBOXD_TLS_DIR}
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_peer"
    if [ "$tls_client" = required ]; then
      tls_conf="$tls_conf
ssl_options.fail_if_no_peer_cert = true
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name"
      plugins+=(rabbitmq_auth_mechanism_ssl)
    else
      tls_conf="$tls_conf
ssl_options.fail_if_no_peer_cert = false"
    fi
  fi
  # Streams (the rabbitmq_stream plugin) where a port is given for them,
  # advertised as this node's address: a stream client connects where the
  # broker's metadata says the stream lives.
  local stream_conf=""
  if [ -n "${OUTBOXD_STREAM_PORT:-}" ]; then
    reserve_ports "$OUTBOXD_STREAM_PORT"
    plugins+=(rabbitmq_stream)
    stream_conf="stream.listeners.tcp.1 = $listen:$OUTBOXD_STREAM_PORT
stream.advertised_host = ${node_host:-$listen}
stream.advertised_port = $OUTBOXD_STREAM_PORT"
  fi
  if [ -n "$tls_dir" ] && [ -n "${OUTBOXD_STREAM_TLS_PORT:-}" ]; then
    reserve_ports "$OUTBOXD_STREAM_TLS_PORT"
    [ -n "${OUTBOXD_STREAM_PORT:-}" ] || plugins+=(rabbitmq_stream)
    stream_conf="$stream_conf
stream.listeners.ssl.1 = $listen:$OUTBOXD_STREAM_TLS_PORT
stream.advertised_tls_port = $OUTBOXD_STREAM_TLS_PORT"
  fi
  local plugin_list
  plugin_list=$(IFS=,; echo "[${plugins[*]}]")
  as_svc sh -c "printf 'loopback_users = none\nlog.console = false\nlog.file.level = warning\n%s\n%s\n%s\n' '${OUTBOXD_RABBIT_CONF:-}' '$tls_conf' '$stream_conf' > '$dir/rabbitmq.conf'; echo '$plugin_list.' > '$dir/enabled_plugins'; echo '[{kernel, [{inet_dist_use_interface, {$dist_if}}$ticktime]}].' > '$dir/advanced.config'"

  # shellcheck disable=SC2046
  as_svc env $(rabbit_env "$dir" "$port") setsid /usr/lib/rabbitmq/bin/rabbitmq-server \
    >"$dir/stdout.log" 2>&1 </dev/null &
  local server=$! i
  # Its AMQP port opens as the boot ends; until then a connection attempt
  # is all a check costs (rabbitmqctl's VM, ~1 s a call, only after it).
  # At most 1,200 checks 0.2 s apart: four minutes.
  for i in $(seq 1 1200); do
    if (exec 3<>"/dev/tcp/$listen/$port") 2>/dev/null \
      && rabbit_ctl "$dir" "$port" -q await_startup >/dev/null 2>&1; then
      log "RabbitMQ up on $listen:$port ($dir)"
      return 0
    fi
    # A node that stopped (a port in use) is not waited for.
    kill -0 "$server" 2>/dev/null || break
    sleep 0.2
  done
  log "RabbitMQ did not start; see $dir/log and $dir/stdout.log"
  tail -n 30 "$dir/stdout.log" >&2 || true
  exit 1
}

# epmd, started by the first RabbitMQ node, outlives it; it refuses to stop
# (harmlessly) while another node is registered with it.
epmd_stop() {
  local epmd
  epmd=$(command -v epmd || ls /usr/lib/erlang/erts-*/bin/epmd 2>/dev/null | head -n 1 || true)
  [ -n "$epmd" ] || return 0
  as_svc env ERL_EPMD_ADDRESS=127.0.0.1 "$epmd" -kill >/dev/null 2>&1 || true
}

rabbit_stop() {
  local dir=$1 port=$2
  # No pid file: the node is not running (rabbitmqctl would wait for the
  # file to appear, forever).
  [ -f "$dir/rabbit.pid" ] || return 0
  # With the pid file, rabbitmqctl also waits for the VM to exit, so a start
  # right after a stop never races the old node for its name.
  rabbit_ctl "$dir" "$port" -q stop "$dir/rabbit.pid" >/dev/null 2>&1 || true
}

print_env() {
  cat <<EOF
export DATABASE_URL=postgres://outboxd:outboxd@127.0.0.1:$pg_port/outboxd
export AMQP_URL=amqp://guest:guest@127.0.0.1:$amqp_port/%2f
export OUTBOXD_STREAM_URL=rabbitmq-stream://guest:guest@127.0.0.1:$stream_port/%2f
export OUTBOXD_PG_ADMIN_URL=postgres://outboxd:outboxd@127.0.0.1:$pg_port/postgres
export OUTBOXD_PGBOUNCER_PORT=$bouncer_port
export OUTBOXD_MYSQL_URL=mysql://outboxd:outboxd@127.0.0.1:$mysql_port/outboxd
export OUTBOXD_MYSQL_ADMIN_URL=mysql://outboxd:outboxd@127.0.0.1:$mysql_port/
export OUTBOXD_STATE_DIR=$state
EOF
}

cmd=${1:-up}
case "$cmd" in
  up)
    ensure_packages
    pg_start
    pgbouncer_start "$state/pgbouncer" "$bouncer_port" 127.0.0.1 "$pg_port"
    mariadb_start
    OUTBOXD_STREAM_PORT=$stream_port rabbit_start "$state/rabbit" "$amqp_port"
    print_env | tee "$state/env"
    ;;
  down)
    rabbit_stop "$state/rabbit" "$amqp_port"
    epmd_stop
    pgbouncer_stop "$state/pgbouncer"
    mariadb_stop
    pg_stop fast
    ;;
  # RabbitMQ alone (the demo on SQLite needs no database server).
  broker)
    [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || apt_install rabbitmq-server
    OUTBOXD_STREAM_PORT=$stream_port rabbit_start "$state/rabbit" "$amqp_port"
    print_env | tee "$state/env"
    ;;
  env) print_env ;;
  pg)
    case "${2:-}" in
      start) ensure_packages; pg_start ;;
      stop) pg_stop "${3:-fast}" ;;
      standby) [ $# -ge 4 ] || { log "usage: $0 pg standby HOST PORT"; exit 2; }
        ensure_packages; pg_standby "$3" "$4" ;;
      promote) pg_promote ;;
      tls-reload) pg_tls_reload ;;
      *) log "usage: $0 pg start|stop [fast|immediate]|standby HOST PORT|promote|tls-reload"; exit 2 ;;
    esac
    ;;
  mariadb)
    case "${2:-}" in
      start) ensure_packages; mariadb_start ;;
      stop) mariadb_stop ;;
      kill) mariadb_stop kill ;;
      *) log "usage: $0 mariadb start|stop|kill"; exit 2 ;;
    esac
    ;;
  pgbouncer)
    case "${2:-}" in
      start) [ $# -ge 6 ] || { log "usage: $0 pgbouncer start DIR PORT HOST PGPORT"; exit 2; }
        ensure_packages; pgbouncer_start "$3" "$4" "$5" "$6" ;;
      repoint) [ $# -ge 6 ] || { log "usage: $0 pgbouncer repoint DIR PORT HOST PGPORT"; exit 2; }
        pgbouncer_repoint "$3" "$4" "$5" "$6" ;;
      stop) [ $# -ge 3 ] || { log "usage: $0 pgbouncer stop DIR"; exit 2; }
        pgbouncer_stop "$3" ;;
      *) log "usage: $0 pgbouncer start|repoint|stop DIR …"; exit 2 ;;
    esac
    ;;
  rabbit)
    [ $# -ge 4 ] || { log "usage: $0 rabbit start|stop|ctl DIR PORT [rabbitmqctl args]"; exit 2; }
    case "$2" in
      start) ensure_packages; rabbit_start "$3" "$4" ;;
      stop) rabbit_stop "$3" "$4" ;;
      ctl) dir=$3 port=$4; shift 4; rabbit_ctl "$dir" "$port" "$@" ;;
      # Erlang's TLS caches the PEM files it read; new connections read them anew.
      tls-reload) tls_copy "$3/tls"; rabbit_ctl "$3" "$4" -q eval 'ssl:clear_pem_cache().' >/dev/null ;;
      *) log "usage: $0 rabbit start|stop|ctl|tls-reload DIR PORT [rabbitmqctl args]"; exit 2 ;;
    esac
    ;;
  *) log "usage: $0 up|broker|down|env|pg|mariadb|pgbouncer|rabbit"; exit 2 ;;
esac
