#!/usr/bin/env bash
# Test hosts on one machine: a private network ("lab") of network
# namespaces, each its own host with its own address, joined by a bridge
# whose address (the gateway) is where the lab's PostgreSQL and RabbitMQ
# listen. Faults are applied per host and per destination port with
# nftables inside the host's namespace, so removing the namespace removes
# its rules. Needs root (it installs nftables and iproute2 if missing).
#
#   scripts/hosts.sh up LAB N            lab LAB (1-250): bridge obxLAB, 10.213.LAB.0/24,
#                                        gateway .1, hosts h1..hN at .11, .12, …
#   scripts/hosts.sh down LAB            kill what runs in its hosts, remove hosts and bridge
#   scripts/hosts.sh sweep               remove every lab (leftovers of killed tests)
#   scripts/hosts.sh gateway LAB         the gateway address
#   scripts/hosts.sh addr LAB H          host H's address
#   scripts/hosts.sh exec LAB H CMD…     run CMD on host H
#   scripts/hosts.sh fault LAB H DEST blackhole|deaf|reset|loss PCT
#                                        on host H, traffic to/from DEST: the gateway's
#                                        ports (comma-separated), "hosts:H2[,H3]" (other
#                                        hosts of the lab), or "all" (every packet of
#                                        the host): dropped, only the packets coming
#                                        back dropped (deaf: what H sends arrives, no
#                                        answer does), refused with a TCP reset, or
#                                        PCT % of packets dropped
#   scripts/hosts.sh heal LAB H          remove every fault of host H
#
# Delay and jitter need the kernel's sch_netem, which some kernels lack
# (this project's CI machines among them): the tests put a delaying TCP
# proxy on the link instead (tests/common/hosts.rs).
#
# By hand, e.g. a worker on host 2 of lab 7 that loses its database:
#   scripts/hosts.sh up 7 3
#   OUTBOXD_LISTEN=10.213.7.1 OUTBOXD_STATE_DIR=/tmp/lab7 OUTBOXD_PG_PORT=25432 scripts/services.sh pg start
#   DATABASE_URL=postgres://outboxd:outboxd@10.213.7.1:25432/outboxd scripts/hosts.sh exec 7 2 target/debug/outboxd work
#   scripts/hosts.sh fault 7 2 25432 blackhole; …; scripts/hosts.sh heal 7 2; scripts/hosts.sh down 7
set -euo pipefail

log() { echo "hosts: $*" >&2; }
die() { log "$*"; exit 2; }

need_tools() {
  local want=()
  command -v nft >/dev/null 2>&1 || want+=(nftables)
  command -v ip >/dev/null 2>&1 || want+=(iproute2)
  if [ "${#want[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "need root to install ${want[*]}"
    log "apt-get install ${want[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}" >&2
  fi
}

check_lab() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le 250 ] || die "lab must be 1-250, not '$1'"; }
bridge() { echo "obx$1"; }
ns() { echo "obx$1-h$2"; }
gateway() { echo "10.213.$1.1"; }
addr() { echo "10.213.$1.$((10 + $2))"; }

up() {
  local lab=$1 n=$2 h
  check_lab "$lab"
  need_tools
  ip link show "$(bridge "$lab")" >/dev/null 2>&1 && die "lab $lab exists"
  ip link add "$(bridge "$lab")" type bridge
  ip addr add "$(gateway "$lab")/24" dev "$(bridge "$lab")"
  ip link set "$(bridge "$lab")" up
  for h in $(seq 1 "$n"); do
    ip netns add "$(ns "$lab" "$h")"
    ip link add "$(ns "$lab" "$h")" type veth peer name eth0 netns "$(ns "$lab" "$h")"
    ip link set "$(ns "$lab" "$h")" master "$(bridge "$lab")" up
    ip -n "$(ns "$lab" "$h")" addr add "$(addr "$lab" "$h")/24" dev eth0
    ip -n "$(ns "$lab" "$h")" link set eth0 up
    ip -n "$(ns "$lab" "$h")" link set lo up
  done
}

down() {
  local lab=$1 n pid
  check_lab "$lab"
  for n in $(ip netns list | awk '{print $1}' | grep "^obx$lab-h" || true); do
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
  ip link del "$(bridge "$lab")" 2>/dev/null || true
}

sweep() {
  local lab
  for lab in $( (ip netns list | awk '{print $1}'; ip -o link show type bridge | awk -F': ' '{print $2}') \
      | sed -n 's/^obx\([0-9]\{1,3\}\).*/\1/p' | sort -u); do
    log "removing lab $lab"
    down "$lab"
  done
}

# The nft rules of one fault: traffic between the host and the gateway's
# ports (both directions), or every packet of the host's link.
fault() {
  local lab=$1 h=$2 ports=$3 kind=$4 pct=${5:-} gw action match_out match_in
  check_lab "$lab"
  gw=$(gateway "$lab")
  case "$kind" in
    blackhole|deaf) action=drop ;;
    reset) action="reject with tcp reset" ;;
    loss)
      [[ "$pct" =~ ^[0-9]+$ ]] && [ "$pct" -le 100 ] || die "loss needs a percentage 0-100"
      action="numgen random mod 100 < $pct drop" ;;
    *) die "unknown fault '$kind' (blackhole, deaf, reset, loss PCT)" ;;
  esac
  if [ "$ports" = all ]; then
    match_out='oifname "eth0"'
    match_in='iifname "eth0"'
    [ "$kind" != reset ] || action="reject"
  elif [[ "$ports" =~ ^hosts:[0-9]+(,[0-9]+)*$ ]]; then
    local peers="" p
    for p in $(echo "${ports#hosts:}" | tr , ' '); do peers+="${peers:+, }$(addr "$lab" "$p")"; done
    match_out="ip daddr { $peers }"
    match_in="ip saddr { $peers }"
    [ "$kind" != reset ] || action="reject"
  else
    [[ "$ports" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "DEST must be ports separated by commas, hosts:H[,H], or all"
    match_out="ip daddr $gw tcp dport { $ports }"
    match_in="ip saddr $gw tcp sport { $ports }"
  fi
  ip netns exec "$(ns "$lab" "$h")" nft -f - <<EOF
table inet outboxd_faults {
  chain out { type filter hook output priority 0; policy accept; }
  chain in { type filter hook input priority 0; policy accept; }
}
add rule inet outboxd_faults in $match_in $action
EOF
  # Deaf: what the host sends still goes out; nothing comes back.
  [ "$kind" = deaf ] || ip netns exec "$(ns "$lab" "$h")" nft add rule inet outboxd_faults out "$match_out" "$action"
}

heal() {
  check_lab "$1"
  ip netns exec "$(ns "$1" "$2")" nft delete table inet outboxd_faults 2>/dev/null || true
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  up) [ $# -eq 2 ] || die "usage: $0 up LAB N"; up "$1" "$2" ;;
  down) [ $# -eq 1 ] || die "usage: $0 down LAB"; down "$1" ;;
  sweep) sweep ;;
  gateway) check_lab "$1"; gateway "$1" ;;
  addr) check_lab "$1"; addr "$1" "$2" ;;
  exec) [ $# -ge 3 ] || die "usage: $0 exec LAB H CMD…"; lab=$1 h=$2; shift 2; check_lab "$lab"; exec ip netns exec "$(ns "$lab" "$h")" "$@" ;;
  fault) [ $# -ge 4 ] || die "usage: $0 fault LAB H PORTS|hosts:H,…|all blackhole|deaf|reset|loss PCT"; fault "$@" ;;
  heal) [ $# -eq 2 ] || die "usage: $0 heal LAB H"; heal "$1" "$2" ;;
  *) die "usage: $0 up|down|sweep|gateway|addr|exec|fault|heal (see the top of this file)" ;;
esac
