#!/usr/bin/env bash
# Builds the portable ddprun (cmake/portable.cmake: its only run-time dependency is glibc 2.31 or
# newer) and packs it twice, with the same files:
#   build/package/ddprun-<version>-linux-x86_64.tar.gz   bin/ddprun, share/ddprun/...
#   build/package/ddprun_<version>_amd64.deb             /usr/bin/ddprun, /usr/share/ddprun/...
# The C library it links is a Debian 11 root's: DDPRUN_SYSROOT, else build/deb11-root, made here
# with debootstrap from the Debian mirror the first time (about 1.5 minutes, 230 MB; kept).
# Prints the two paths. Run as root the first time (debootstrap), then as anyone.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${DDPRUN_SYSROOT:-$PWD/build/deb11-root}"
if [[ ! -f "$root/usr/lib/x86_64-linux-gnu/libc.so" ]]; then
  scripts/deb11-root.sh "$root" >&2
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
DDPRUN_SYSROOT="$root" cmake --preset portable "${launcher[@]}" >/dev/null
cmake --build --preset portable -j "$(nproc)" --target ddprun >&2
binary=build/portable/cli/ddprun
version=$("$binary" --version | head -1 | cut -d' ' -f2)
name="ddprun-$version-linux-x86_64"
out=build/package
rm -rf "$out/$name" "$out/deb"
mkdir -p "$out/$name/bin" "$out/$name/share"
strip -o "$out/$name/bin/ddprun" "$binary"
cp -r build/portable/share/ddprun "$out/$name/share/"
tar -C "$out" --owner=0 --group=0 --sort=name -czf "$out/$name.tar.gz" "$name"

# The .deb: the same files under /usr; Depends says the one library it needs.
mkdir -p "$out/deb/DEBIAN" "$out/deb/usr"
cp -r "$out/$name/bin" "$out/$name/share" "$out/deb/usr/"
cat >"$out/deb/DEBIAN/control" <<CONTROL
Package: ddprun
Version: $version
Architecture: amd64
Maintainer: ddprun developers <ddprun@localhost>
Depends: libc6 (>= 2.31)
Recommends: python3
Section: utils
Priority: optional
Description: runs multi-node PyTorch DDP and Lightning jobs from one TOML job file
 The same command on every node: agents rendezvous, launch the workers with the
 environment torchrun gives them, stop the whole job on the first failure and
 explain its root cause. Includes a simulator of the same code.
CONTROL
dpkg-deb --root-owner-group --build "$out/deb" "$out/ddprun_${version}_amd64.deb" >&2
rm -rf "$out/deb"
echo "$out/$name.tar.gz"
echo "$out/ddprun_${version}_amd64.deb"
