#!/usr/bin/env bash
# Builds the Debian package of outboxd: /usr/bin/outboxd, the configuration
# /etc/outboxd/outboxd.toml and /etc/default/outboxd (conffiles), and the
# hardened systemd unit outboxd.service (packaging/). Prints the .deb's path.
#
#   scripts/package.sh                    # cargo build --release, then package
#   scripts/package.sh --binary PATH      # package an outboxd already built
#   scripts/package.sh --out DIR          # where the .deb goes (target/debian)
#
# Install with `dpkg -i`; configure /etc/outboxd/outboxd.toml (or the
# environment in /etc/default/outboxd), then `systemctl enable --now outboxd`.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
out="target/debian"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "package.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
for tool in dpkg-deb dpkg; do
  command -v "$tool" >/dev/null || { echo "package.sh: $tool is needed (Debian's dpkg)" >&2; exit 1; }
done
if [ -z "$binary" ]; then
  cargo build --release --locked >&2
  binary=target/release/outboxd
fi
[ -x "$binary" ] || { echo "package.sh: no executable at $binary" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
# Semver's pre-release (0.2.0-dev) is Debian's tilde (0.2.0~dev), which
# sorts before 0.2.0 as semver's does.
version=${version/-/\~}
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
chmod 0755 "$stage"
trap 'rm -rf "$stage"' EXIT

install -D -m 0755 "$binary" "$stage/usr/bin/outboxd"
if command -v strip >/dev/null; then strip --strip-unneeded "$stage/usr/bin/outboxd"; fi
install -D -m 0640 config/outboxd.toml "$stage/etc/outboxd/outboxd.toml"
install -D -m 0640 packaging/default.env "$stage/etc/default/outboxd"
install -D -m 0644 packaging/outboxd.service "$stage/lib/systemd/system/outboxd.service"
install -D -m 0644 README.md "$stage/usr/share/doc/outboxd/README.md"
# The book, so that the README's links resolve on the installed host too.
for page in docs/*.md; do install -D -m 0644 "$page" "$stage/usr/share/doc/outboxd/$page"; done
printf 'outboxd %s\nLicense: %s\n' "$version" \
  "$(sed -n 's/^license = "\(.*\)"$/\1/p' Cargo.toml)" > "$stage/usr/share/doc/outboxd/copyright"

mkdir -p "$stage/DEBIAN"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" packaging/debian/control.in > "$stage/DEBIAN/control"
echo "Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)" >> "$stage/DEBIAN/control"
install -m 0644 packaging/debian/conffiles "$stage/DEBIAN/conffiles"
for script in postinst prerm postrm; do
  install -m 0755 "packaging/debian/$script" "$stage/DEBIAN/$script"
done

mkdir -p "$out"
deb="$out/outboxd_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >&2
echo "$deb"
