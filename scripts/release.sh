#!/usr/bin/env bash
# Builds the two release artefacts into target/dist/:
#   compaction-proxy-x86_64-linux   a static x86_64 Linux binary (glibc, +crt-static),
#                                   stripped, built with the `ship` profile (Cargo.toml)
#   compaction-proxy.oci.tar        an OCI image archive from scratch (scripts/oci-image.py)
# The Dockerfile builds the same binary with the same flags and the same image files.
# Then `scripts/release-check.sh` runs both as a user would.
#
# Usage: scripts/release.sh [--profile NAME]
#   --profile NAME  a cheaper profile than `ship` (e.g. `release`, `dev`): CI checks the
#                   packaging with one (.ci/run), not the optimisation.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=ship
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    *) echo "usage: scripts/release.sh [--profile NAME]" >&2; exit 2 ;;
  esac
done
TARGET=x86_64-unknown-linux-gnu
DIST=target/dist
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

# glibc linked statically: musl's std cannot be installed here (no rustup downloads),
# and Debian's libc6-dev carries libc.a. With an explicit --target, RUSTFLAGS reach the
# binary only, not build scripts and proc-macros (which must stay dynamic).
# Stripped by the linker (the `ship` profile says so; forced here for the others too).
export RUSTFLAGS="-C target-feature=+crt-static"
profile_var=$(tr 'a-z-' 'A-Z_' <<<"$profile")
export "CARGO_PROFILE_${profile_var}_STRIP=symbols"
start=$(date +%s)
cargo build --locked --profile "$profile" --target "$TARGET" --bin compaction-proxy
echo "release: built with profile $profile in $(($(date +%s) - start)) s" >&2
out=target/$TARGET/$([ "$profile" = dev ] && echo debug || echo "$profile")/compaction-proxy

mkdir -p "$DIST"
cp "$out" "$DIST/compaction-proxy-x86_64-linux.tmp"
mv "$DIST/compaction-proxy-x86_64-linux.tmp" "$DIST/compaction-proxy-x86_64-linux"
# Static: no program interpreter (PT_INTERP) to look for in an empty root.
if python3 - "$DIST/compaction-proxy-x86_64-linux" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f:
    elf = f.read(1 << 16)
phoff, = struct.unpack_from("<Q", elf, 0x20)
phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
types = [struct.unpack_from("<I", elf, phoff + i * phentsize)[0] for i in range(phnum)]
sys.exit(0 if 3 in types else 1)  # PT_INTERP == 3
PY
then
  echo "release: $DIST/compaction-proxy-x86_64-linux is dynamically linked" >&2
  exit 1
fi

CA=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$CA" ]; then
  # Debian's CA roots; the image carries them for anything that reads SSL_CERT_FILE (the
  # binary itself trusts the Mozilla roots it embeds, webpki-roots).
  sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get install -y --no-install-recommends ca-certificates >&2 \
    || { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends ca-certificates >&2; }
fi
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)} \
  python3 scripts/oci-image.py --binary "$DIST/compaction-proxy-x86_64-linux" --ca-bundle "$CA" \
  --version "$VERSION" --out "$DIST/compaction-proxy.oci.tar"
ls -l "$DIST"
