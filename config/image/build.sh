#!/usr/bin/env bash
# Builds the operator's image offline: a static operator binary (cargo, crt-static) packed
# FROM scratch by config/image/Containerfile with buildah (or podman when buildah is missing).
#
# Usage: config/image/build.sh [--profile release|dev] [--tag IMAGE]
#   --profile  cargo profile (release, the default, is what you ship; dev builds faster and is
#              what the tests pack)
#   --tag      image name (default localhost/gpuqueue-operator:dev)
# Prints the image name on its last line.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
profile=release
tag=localhost/gpuqueue-operator:dev
while (( $# )); do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "config/image/build.sh: unknown argument $1 (use --profile release|dev, --tag IMAGE)" >&2; exit 2 ;;
  esac
done
case $profile in
  release) out=release ;;
  dev) out=debug ;;
  *) echo "config/image/build.sh: --profile must be release or dev, not $profile" >&2; exit 2 ;;
esac

log() { printf '[image] %s\n' "$*" >&2; }

# The gnu target named explicitly: RUSTFLAGS then apply to the target only, so build scripts
# and proc macros stay dynamic executables.
target=x86_64-unknown-linux-gnu
log "building gpuqueue-operator ($profile, static) for $target"
(cd "$repo" && RUSTFLAGS='-C target-feature=+crt-static' cargo build --locked --quiet \
  --profile "$profile" -p gpuqueue-operator --bin gpuqueue-operator --target "$target")
binary="$repo/target/$target/$out/gpuqueue-operator"

# FROM scratch has no loader and no libraries: refuse a binary that would need either.
if readelf --program-headers "$binary" | grep -q INTERP || readelf --dynamic "$binary" | grep -q NEEDED; then
  echo "config/image/build.sh: $binary is dynamically linked; it cannot run FROM scratch" >&2
  exit 1
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$binary" "$context/gpuqueue-operator"
if command -v buildah >/dev/null; then
  buildah build --quiet --file "$repo/config/image/Containerfile" --tag "$tag" "$context" >&2
elif command -v podman >/dev/null; then
  podman build --quiet --file "$repo/config/image/Containerfile" --tag "$tag" "$context" >&2
else
  echo "config/image/build.sh: needs buildah or podman (apt-get install buildah)" >&2
  exit 1
fi
log "built $tag ($(du -h "$binary" | cut -f1) binary)"
echo "$tag"
