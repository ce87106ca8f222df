#!/usr/bin/env bash
# Makes a Debian 11 (bullseye) root in DIR with debootstrap, from the Debian mirror: the C
# library the portable build links (libc6-dev), and the system its tests run ddprun on (with
# Python 3.9 for the `ddprun` module's test). Nothing else is installed.
#   scripts/deb11-root.sh DIR    (root; about 1.5 minutes and 230 MB)
set -euo pipefail
dir=$1
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >/dev/null
fi
rm -rf "$dir.partial"
debootstrap --variant=minbase --include=libc6-dev,python3 bullseye "$dir.partial" "$mirror"
# Links that name absolute paths (libpthread.so -> /lib/x86_64-linux-gnu/libpthread.so.0) would
# lead the linker, which prefixes only the path it was given with the root, to this machine's
# libraries: make them relative. Inside the root they name the same files.
fix_links() {
  local link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    [[ $target == /* ]] || continue
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$dir$target")" "$link"
  done < <(find "$dir/usr/lib" "$dir/usr/lib64" "$dir/lib64" -maxdepth 2 -type l -print0 2>/dev/null)
}
final=$dir
dir=$dir.partial
fix_links
mv "$dir" "$final"
