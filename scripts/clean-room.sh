#!/usr/bin/env bash
# The clean-room set-up check: runs a command in a brand-new Debian 12 root
# that holds nothing but Debian's minimal system and a clean clone of this
# repository's committed HEAD, as a new user's machine would. A package that a
# developer's machine has from earlier work, but scripts/setup.sh does not
# install, fails here instead of on a user's machine. CI runs it after the
# test suite.
#
# Usage (as root, or with sudo): scripts/clean-room.sh [COMMAND...]
#   default COMMAND: scripts/setup.sh as scripts/run.sh calls it (install,
#   configure everything including the tests, so that CMake finds each
#   package the tests need, and build the binary) and a short run of it: 3
#   training steps of the main job's model and a 2-rank collective benchmark
#   under mpirun. (The test suite's build is checked where CI runs it.)
#
# The base root (Debian 12 "bookworm", mmdebstrap's apt variant, ~240 MB) is
# built once and kept as a tarball; downloaded .deb files are kept too, so a
# repeated run installs the same packages without downloading them again.
#   MESHTRAIN_CLEAN_ROOM_CACHE   where both are kept (default /var/cache/meshtrain-clean-room)
#   MESHTRAIN_CLEAN_ROOM_KEEP=1  keep the root afterwards (its path is printed)
# Mounts (/proc, /sys, /dev, a private /dev/shm) live in a private mount
# namespace: they vanish with it, even if this script is killed.
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$self")/.."
repo=$(pwd)

if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null && exec sudo --preserve-env=MESHTRAIN_CLEAN_ROOM_CACHE,MESHTRAIN_CLEAN_ROOM_KEEP "$self" "$@"
  echo "clean-room: needs root (it makes a chroot); run it as root or install sudo" >&2
  exit 2
fi
git rev-parse --verify -q HEAD >/dev/null || { echo "clean-room: $repo is not a git checkout with a commit" >&2; exit 2; }
[ -z "$(git status --porcelain --untracked-files=no)" ] ||
  echo "clean-room: note: uncommitted changes are not checked; the root gets a clone of HEAD only"

cmd=("$@")
if [ ${#cmd[@]} -eq 0 ]; then
  cmd=(bash -c 'set -e; scripts/setup.sh build --target meshtrain
    build/meshtrain train --config configs/debug.toml --training.steps 3 --checkpoint.folder ""
    scripts/mpirun.sh -np 2 build/meshtrain bench comm --ops all_reduce --min-bytes 4K --max-bytes 64K')
fi

cache=${MESHTRAIN_CLEAN_ROOM_CACHE:-/var/cache/meshtrain-clean-room}
base=$cache/bookworm-apt-base.tar
debs=$cache/debs
mkdir -p "$cache" "$debs"
if [ ! -s "$base" ]; then
  if ! command -v mmdebstrap >/dev/null; then
    echo "clean-room: installing mmdebstrap (builds the base root)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
  fi
  echo "clean-room: building the base Debian 12 root (once; about a minute)"
  rm -f "$cache/partial.tar"
  mmdebstrap --quiet --variant=apt --include=ca-certificates,git bookworm "$cache/partial.tar" >/dev/null ||
    { echo "clean-room: mmdebstrap failed (it downloads from Debian's mirrors: is the network up?)" >&2; exit 2; }
  mv "$cache/partial.tar" "$base"
fi

root=$(mktemp -d /tmp/meshtrain-clean-room.XXXXXX)
cleanup() {
  # The mounts were made in a namespace that is gone by now; never delete through a mount.
  if [ -n "${MESHTRAIN_CLEAN_ROOM_KEEP:-}" ]; then
    echo "clean-room: root kept at $root"
  elif findmnt -rn -o TARGET | grep -q "^$root"; then
    echo "clean-room: something is still mounted under $root; left in place" >&2
  else
    rm -rf "$root"
  fi
}
trap cleanup EXIT
tar -xf "$base" -C "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
cp -a "$debs/." "$root/var/cache/apt/archives/"
git clone -q --no-hardlinks "$repo" "$root/src/meshtrain"

echo "clean-room: running '${cmd[*]}' in a new Debian 12 root on a clean clone of HEAD ($(git rev-parse --short HEAD))"
start=$(date +%s)
set +e
unshare --mount --propagation private -- bash -c '
  root=$1; shift
  set -e
  mount --bind /proc "$root/proc"; mount --bind /sys "$root/sys"; mount --bind /dev "$root/dev"
  mount --bind /dev/pts "$root/dev/pts"; mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
  exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 CI=true \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /src/meshtrain && exec \"\$@\"" clean-room "$@"
' clean-room "$root" "${cmd[@]}"
rc=$?
set -e
# Keep what apt downloaded for the next run.
cp -a "$root/var/cache/apt/archives/." "$debs/" 2>/dev/null || true
rm -rf "$debs/partial" "$debs/lock"
echo "clean-room: exit $rc after $(($(date +%s) - start)) s"
exit $rc
