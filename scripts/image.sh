#!/usr/bin/env bash
# Builds the outboxd OCI image from the Containerfile with buildah (no
# container engine needed): stages a root filesystem holding the binary,
# the shared libraries it links (from this host), the CA certificates and
# a passwd/group entry for the non-root user 10001, then `buildah bud`.
#
#   scripts/image.sh [--bin PATH] [--tag NAME:TAG]
#
# Default binary: a release build (cargo build --release); default tag:
# outboxd:<the crate's version>. Push with
#   buildah push --storage-driver vfs outboxd:<version> docker://registry.example/outboxd:<version>
# Installs buildah (Debian's) when it is missing and this runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
bin="" tag="outboxd:$version"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    *) echo "image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  cargo build --release --quiet
  bin=target/release/outboxd
fi
if ! command -v buildah >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "image.sh: buildah is missing; install it" >&2; exit 1; }
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >&2
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
root="$context/rootfs"
install -D -m 0755 "$bin" "$root/usr/bin/outboxd"
strip --strip-unneeded "$root/usr/bin/outboxd" 2>/dev/null || true
# The dynamic loader and every library the binary links, at their paths.
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$root/etc" "$root/tmp"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/:/usr/sbin/nologin\noutboxd:x:10001:10001:outboxd:/:/usr/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\noutboxd:x:10001:\n' > "$root/etc/group"
cp Containerfile "$context/"
buildah bud --quiet --isolation chroot --storage-driver vfs \
  --label "org.opencontainers.image.version=$version" \
  -f "$context/Containerfile" -t "$tag" "$context" >&2
echo "$tag"
