#!/usr/bin/env bash
# Builds the Cohort container image without pulling anything from a container registry:
#   1. debootstraps a Debian 12 (bookworm) root file system from the Debian mirror, with the
#      runtime libraries that the binaries link (found with ldd and dpkg -S on this machine) and,
#      unless --no-dataset, Fashion-MNIST (dataset-fashion-mnist); the tarball is cached;
#   2. imports it into podman as the local base image;
#   3. runs `podman build` of deploy/image/Dockerfile FROM that base.
#
#   deploy/image/build-image.sh --install-tree DIR [options]   the binaries of an install tree
#   deploy/image/build-image.sh --from-source [options]        compile in the image's build stage
#
#   --install-tree DIR  a `cmake --install build --prefix DIR` tree; the image gets DIR/bin/*
#                       (Dockerfile target `prebuilt`: nothing is compiled in the image). A
#                       default build uses -march=native (COHORT_NATIVE); for an image that runs
#                       on other machines, build with -DCOHORT_NATIVE=OFF (--from-source does)
#   --from-source       compile Cohort from this source tree in the Dockerfile's build stage
#                       (target `source`; needs the Debian mirror inside the build, about as
#                       long as a Release build of the binaries with --jobs cores)
#   --jobs N            build jobs of --from-source (default 2)
#   --tag NAME          the image's name (default localhost/cohort:dev)
#   --base-tag NAME     the base image's name (default localhost/cohort-base:bookworm-<hash>,
#                       the hash of the suite, mirror and package list)
#   --cache DIR         where the debootstrap tarball is kept (default ~/.cache/cohort-image);
#                       a tarball of the same suite, mirror and packages is reused
#   --mirror URL        the Debian mirror (default: the first bookworm URIs of this machine's
#                       /etc/apt/sources.list*, else http://deb.debian.org/debian)
#   --packages "P ..."  the runtime packages, instead of deriving them from the binaries with
#                       ldd and dpkg -S (with --from-source the default is the runtime
#                       libraries of the build stage's -dev packages; the build checks them)
#   --no-dataset        leave dataset-fashion-mnist out (then mount the data and set data.dir)
#   --storage DIR       podman's storage: --root DIR/root --runroot DIR/run, so nothing outside
#                       DIR is touched (default: podman's own, /var/lib/containers)
#   --storage-driver D  overlay (default) or vfs (slower; for file systems without overlay)
#   --podman-arg ARG    one more global podman argument (repeatable), e.g. --podman-arg=--runtime=runc
#   -h, --help          this text
#
# Needs root (debootstrap), debootstrap, podman (4.3 or later), tar, ldd, dpkg. Prints the image
# name on the last line of stdout.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "build-image.sh: error: $*" >&2; exit 1; }
log() { echo "build-image.sh: $*" >&2; }

here="$(cd "$(dirname "$0")" && pwd)"
source_root="$(cd "$here/../.." && pwd)"
install_tree=""
from_source=0
jobs=2
tag="localhost/cohort:dev"
base_tag=""
cache="${HOME:-/root}/.cache/cohort-image"
mirror=""
packages=""
foreign=""
dataset=1
storage=""
driver="overlay"
podman_extra=()

while [ $# -gt 0 ]; do
  case "$1" in
    --install-tree) install_tree="${2:?--install-tree needs a value}"; shift 2 ;;
    --install-tree=*) install_tree="${1#*=}"; shift ;;
    --from-source) from_source=1; shift ;;
    --jobs) jobs="${2:?--jobs needs a value}"; shift 2 ;;
    --jobs=*) jobs="${1#*=}"; shift ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --tag=*) tag="${1#*=}"; shift ;;
    --base-tag) base_tag="${2:?--base-tag needs a value}"; shift 2 ;;
    --base-tag=*) base_tag="${1#*=}"; shift ;;
    --cache) cache="${2:?--cache needs a value}"; shift 2 ;;
    --cache=*) cache="${1#*=}"; shift ;;
    --mirror) mirror="${2:?--mirror needs a value}"; shift 2 ;;
    --mirror=*) mirror="${1#*=}"; shift ;;
    --packages) packages="${2?--packages needs a value}"; shift 2 ;;
    --packages=*) packages="${1#*=}"; shift ;;
    --no-dataset) dataset=0; shift ;;
    --storage) storage="${2:?--storage needs a value}"; shift 2 ;;
    --storage=*) storage="${1#*=}"; shift ;;
    --storage-driver) driver="${2:?--storage-driver needs a value}"; shift 2 ;;
    --storage-driver=*) driver="${1#*=}"; shift ;;
    --podman-arg) podman_extra+=("${2:?--podman-arg needs a value}"); shift 2 ;;
    --podman-arg=*) podman_extra+=("${1#*=}"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

if [ "$from_source" = 1 ] && [ -n "$install_tree" ]; then
  die "give --install-tree DIR or --from-source, not both"
fi
[ "$from_source" = 1 ] || [ -n "$install_tree" ] || die "give --install-tree DIR or --from-source (see --help)"
case "$jobs" in ''|*[!0-9]*|0) die "--jobs must be a positive integer, got '$jobs'" ;; esac
case "$driver" in overlay|vfs) ;; *) die "--storage-driver must be overlay or vfs, got '$driver'" ;; esac
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap and podman's storage)"
for tool in debootstrap podman tar ldd dpkg sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found (apt-get install debootstrap podman)"
done

if [ -n "$install_tree" ]; then
  install_tree="$(cd "$install_tree" && pwd)" || die "--install-tree: no folder '$install_tree'"
  compgen -G "$install_tree/bin/cohort-*" >/dev/null || die "$install_tree/bin holds no cohort-* binary"
fi

if [ -z "$mirror" ]; then
  # deb822 (URIs: ...) or one-line (deb URL bookworm ...) sources; the first one for bookworm.
  mirror="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
              | awk '/^URIs:/{u=$2} /^Suites:/ && / bookworm( |$)/{print u; exit}')" || true
  if [ -z "$mirror" ]; then
    mirror="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                | awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}')" || true
  fi
  mirror="${mirror:-http://deb.debian.org/debian}"
fi

# The runtime packages: the Debian packages that own the libraries the binaries load.
if [ -z "$packages" ]; then
  if [ "$from_source" = 1 ]; then
    # The Debian 12 runtime libraries of the Dockerfile's build stage (its RUN ldd check fails the
    # build when one is missing).
    packages="libcapnp-0.9.2 libfmt9 libsodium23 libspdlog1.10 libssl3 libtomlplusplus3 libzmq5 zlib1g"
    packages="$packages libstdc++6 libgcc-s1"
    if [ "$(dpkg --print-architecture)" = amd64 ]; then packages="$packages libipsec-mb1"; fi
  fi
fi
if [ -z "$packages" ]; then
  libs="$(for b in "$install_tree"/bin/cohort-*; do ldd "$b"; done \
            | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)"
  missing="$(for b in "$install_tree"/bin/cohort-*; do ldd "$b"; done | grep 'not found' || true)"
  [ -z "$missing" ] || die "the binaries miss libraries on this machine: $missing"
  # A library no Debian package owns (the CUDA toolkit's cudart and cuBLAS, for a build with
  # CUDA) is copied into the image at the same path, where the binaries' RUNPATH finds it.
  for lib in $libs; do
    if owner="$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null)"; then
      echo "${owner%%:*}"
    else
      echo "$lib" >>"${TMPDIR:-/tmp}/cohort-image-foreign.$$"
    fi
  done | sort -u >"${TMPDIR:-/tmp}/cohort-image-packages.$$"
  foreign="$(sort -u "${TMPDIR:-/tmp}/cohort-image-foreign.$$" 2>/dev/null | tr '\n' ' ')"
  rm -f "${TMPDIR:-/tmp}/cohort-image-foreign.$$"
  [ -z "$foreign" ] || log "not from Debian, copied into the image as they are: $foreign"
  packages="$(tr '\n' ' ' <"${TMPDIR:-/tmp}/cohort-image-packages.$$")"
  rm -f "${TMPDIR:-/tmp}/cohort-image-packages.$$"
fi
include="$packages"
[ "$dataset" = 0 ] || include="$include dataset-fashion-mnist"
include="$(echo "$include" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ',' | sed 's/,$//')"
log "runtime packages: $include"

key="$(printf 'bookworm\n%s\n%s\nminbase-v1\n' "$mirror" "$include" | sha256sum | cut -c1-16)"
base_tag="${base_tag:-localhost/cohort-base:bookworm-$key}"
tarball="$cache/cohort-base-bookworm-$key.tar"

podman=(podman --storage-driver "$driver" --cgroup-manager cgroupfs --events-backend file)
if [ -n "$storage" ]; then
  mkdir -p "$storage"
  podman+=(--root "$storage/root" --runroot "$storage/run")
fi
podman+=("${podman_extra[@]}")

work="$(mktemp -d "${TMPDIR:-/tmp}/cohort-image.XXXXXX")"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. The root file system, cached.
if [ -s "$tarball" ]; then
  log "reusing $tarball"
else
  mkdir -p "$cache"
  log "debootstrap bookworm from $mirror (minbase)"
  start=$SECONDS
  debootstrap --variant=minbase --include="$include" bookworm "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
  # What a runtime image does not need; apt and dpkg stay, so a derived image can add packages.
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"* \
         "$work/rootfs/usr/share/doc" "$work/rootfs/usr/share/man" "$work/rootfs/usr/share/info"
  tar --numeric-owner --xattrs -C "$work/rootfs" -cf "$work/base.tar" .
  mv -f "$work/base.tar" "$tarball"
  rm -rf "$work/rootfs"
  log "debootstrap done in $((SECONDS - start)) s: $tarball"
fi

# 2. The local base image (imported again only when it is not in this storage).
if ! "${podman[@]}" image exists "$base_tag"; then
  "${podman[@]}" import --change 'CMD ["/bin/sh"]' "$tarball" "$base_tag" >/dev/null
  log "imported $base_tag"
fi

# 3. The image. Nothing is pulled (--pull=never); RUN steps use chroot isolation and the host
# network (only the build stage uses it, for apt-get).
build=(build --pull=never --isolation chroot --network host
       --build-arg "BASE=$base_tag" -f "$here/Dockerfile" -t "$tag")
start=$SECONDS
if [ -n "$install_tree" ]; then
  mkdir -p "$work/context/install/foreign"
  cp -a "$install_tree/bin" "$work/context/install/"
  for lib in ${foreign:-}; do
    mkdir -p "$work/context/install/foreign$(dirname "$lib")"
    cp -L "$lib" "$work/context/install/foreign$lib"
  done
  "${podman[@]}" "${build[@]}" --target prebuilt --build-arg INSTALL_TREE=install "$work/context" >&2
else
  "${podman[@]}" "${build[@]}" --target source --build-arg "JOBS=$jobs" \
    --ignorefile "$here/source.ignore" "$source_root" >&2
fi
log "podman build done in $((SECONDS - start)) s"
echo "$tag"
