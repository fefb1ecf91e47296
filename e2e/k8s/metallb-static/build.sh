#!/usr/bin/env bash
# Builds MetalLB's controller and speaker static (CGO_ENABLED=0, as MetalLB's own Dockerfiles
# build them for their distroless/static images) from the module e2e/k8s/metallb pins, for the
# images the lab's real nodes run (e2e/src/realnode/metallb.rs). e2e/k8s/build.sh's MetalLB
# programs are linked against libc: they run on the lab's host, not in an image without one.
# Prints the folder that holds `controller`, `speaker`, MetalLB's LICENSE and its
# `metallb-native.yaml`. Needs Go and the Go module proxy (the modules are those e2e/k8s/build.sh
# already downloaded).
#
# The folder is in a cache outside the repository ($SWIMLB_METALLB_STATIC_CACHE, default
# /var/cache/swimlb-metallb-static, or ~/.cache/swimlb-metallb-static where that is not
# writable), named after a hash of the pinned module and of this script, so a second run builds
# nothing and a change of pin builds anew. Not e2e/k8s/build.sh's cache: that script removes every
# other build in its own.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
module="$here/../metallb"
cache="${SWIMLB_METALLB_STATIC_CACHE:-/var/cache/swimlb-metallb-static}"
if [ -z "${SWIMLB_METALLB_STATIC_CACHE:-}" ] && ! { mkdir -p "$cache" && [ -w "$cache" ]; } 2>/dev/null; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/swimlb-metallb-static"
fi

if ! command -v go >/dev/null 2>&1; then
  echo "e2e/k8s/metallb-static/build.sh: no Go toolchain (go) on PATH: MetalLB's images need it" >&2
  exit 1
fi

# Tests that need the programs start in parallel: one builds, the others wait for it here.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key=$(cat "$0" "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-16)
out="$cache/$key"
files=(controller speaker LICENSE metallb-native.yaml)

built=1
for f in "${files[@]}"; do
  [ -s "$out/$f" ] || built=0
done
if [ "$built" -eq 1 ]; then
  echo "$out"
  exit 0
fi

export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local CGO_ENABLED=0
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
started=$(date +%s)
echo "e2e/k8s/metallb-static/build.sh: building MetalLB's controller and speaker into $out" >&2
# The module proxy's answers are checked against go.sum; -mod=readonly refuses to change it.
(cd "$module" && go build -mod=readonly -trimpath -ldflags=-s -o "$tmp/" \
  go.universe.tf/metallb/controller go.universe.tf/metallb/speaker)
mlb=$(cd "$module" && go list -mod=readonly -m -f '{{.Dir}}' go.universe.tf/metallb)
cp "$mlb/LICENSE" "$tmp/LICENSE"
cp "$mlb/config/manifests/metallb-native.yaml" "$tmp/metallb-native.yaml"
mkdir -p "$out"
for f in "${files[@]}"; do
  mv "$tmp/$f" "$out/$f"
done
# Builds of older pins are not used again.
for old in "$cache"/*; do
  [ "$old" = "$out" ] || [ ! -d "$old" ] || rm -rf "$old"
done
echo "e2e/k8s/metallb-static/build.sh: built in $(($(date +%s) - started)) s" >&2
echo "$out"
