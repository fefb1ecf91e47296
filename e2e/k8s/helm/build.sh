#!/usr/bin/env bash
# Builds helm from the Go module pinned in this folder (helm.sh/helm/v4, go.mod and go.sum), for
# the tests of the chart deploy/helm/swimlb (e2e/tests/helm.rs). Prints the folder that holds
# the program `helm`.
#
# The folder is in the cache of e2e/k8s/build.sh ($SWIMLB_K8S_CACHE, default
# /var/cache/swimlb-k8s, or ~/.cache/swimlb-k8s where that is not writable), under helm/, named
# after a hash of the pinned module and of this script, so a second run builds nothing and a
# change of pin builds anew. e2e/k8s/build.sh empties that cache when its own pin changes; this
# script then builds helm again. Needs Go and the Go module proxy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SWIMLB_K8S_CACHE:-/var/cache/swimlb-k8s}"
if [ -z "${SWIMLB_K8S_CACHE:-}" ] && ! { mkdir -p "$cache" && [ -w "$cache" ]; } 2>/dev/null; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/swimlb-k8s"
fi

if ! command -v go >/dev/null 2>&1; then
  echo "e2e/k8s/helm/build.sh: no Go toolchain (go) on PATH: the chart's tests need it to build helm" >&2
  exit 1
fi

# The lock of e2e/k8s/build.sh: it removes every folder of the cache but its own when it builds,
# so the two never run at once. Tests that start in parallel wait here for the one that builds.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key=$(cat "$0" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
out="$cache/helm/$key"
if [ -x "$out/helm" ]; then
  echo "$out"
  exit 0
fi

export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
started=$(date +%s)
echo "e2e/k8s/helm/build.sh: building helm into $out" >&2
# The release's version, stamped as helm's own Makefile stamps it (`helm version`).
version=$(awk '$1 == "helm.sh/helm/v4" { print $2 }' "$here/go.mod")
# The module proxy's answers are checked against go.sum; -mod=readonly refuses to change it.
(cd "$here" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
  -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version \
    -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
mkdir -p "$out"
mv "$tmp/helm" "$out/helm"
# Builds of older pins are not used again.
for old in "$cache"/helm/*; do
  [ "$old" = "$out" ] || [ ! -d "$old" ] || rm -rf "$old"
done
echo "e2e/k8s/helm/build.sh: built in $(($(date +%s) - started)) s" >&2
echo "$out"
