#!/usr/bin/env bash
# Builds the real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) from the Go modules pinned in control-plane/, and takes MetalLB's
# manifest from the module pinned in metallb/ (its programs, in its images, are built statically
# by metallb-static/build.sh), for the Kubernetes lab. Prints the folder that holds them.
#
# The folder is in a cache outside the repository ($SWIMLB_K8S_CACHE, default
# /var/cache/swimlb-k8s, or ~/.cache/swimlb-k8s where that is not writable), named after a hash of the pinned modules and of this script, so a
# second run builds nothing and a change of pin builds anew. Needs Go and the Go module proxy.
# On a fresh 2-core machine the whole build takes about 11 minutes (the book's lab page).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SWIMLB_K8S_CACHE:-/var/cache/swimlb-k8s}"
if [ -z "${SWIMLB_K8S_CACHE:-}" ] && ! { mkdir -p "$cache" && [ -w "$cache" ]; } 2>/dev/null; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/swimlb-k8s"
fi

if ! command -v go >/dev/null 2>&1; then
  echo "e2e/k8s/build.sh: no Go toolchain (go) on PATH: the Kubernetes lab needs it to build its control plane" >&2
  exit 1
fi

# Tests that need the programs start in parallel: one builds, the others wait for it here.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key=$(cat "$0" "$here"/control-plane/go.mod "$here"/control-plane/go.sum \
  "$here"/metallb/go.mod "$here"/metallb/go.sum | sha256sum | cut -c1-16)
out="$cache/$key"
programs=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

built=1
for p in "${programs[@]}"; do
  [ -x "$out/$p" ] || built=0
done
[ -f "$out/metallb-native.yaml" ] || built=0
if [ "$built" -eq 1 ]; then
  echo "$out"
  exit 0
fi

export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
started=$(date +%s)
# The module proxy's answers are checked against go.sum; -mod=readonly refuses to change it.
echo "e2e/k8s/build.sh: building the control plane into $out (first time: about 10 minutes)" >&2
# The release's version, stamped as Kubernetes' own build stamps it (/version, kubectl version).
version=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/control-plane/go.mod")
minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd "$here/control-plane" && go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/" \
  go.etcd.io/etcd/server/v3 \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl)
# etcd's main package is the module root `server`.
mv "$tmp/server" "$tmp/etcd"
# MetalLB's manifests and CRDs, from the same pinned module. Nothing above builds from it, so
# download it first: `go list -m` names no folder (and exits 0) for a module not yet downloaded.
(cd "$here/metallb" && go mod download go.universe.tf/metallb)
mlb=$(cd "$here/metallb" && go list -mod=readonly -m -f '{{.Dir}}' go.universe.tf/metallb)
[ -n "$mlb" ] || { echo "e2e/k8s/build.sh: no folder for go.universe.tf/metallb" >&2; exit 1; }
cp "$mlb/config/manifests/metallb-native.yaml" "$tmp/metallb-native.yaml"
mkdir -p "$out"
for p in "${programs[@]}" metallb-native.yaml; do
  mv "$tmp/$p" "$out/$p"
done
# Builds of older pins are not used again: 500 MB each. Only folders named like this script's
# (16 hex digits): helm/build.sh keeps its builds in helm/ of the same cache.
for old in "$cache"/*; do
  [[ ${old##*/} =~ ^[0-9a-f]{16}$ ]] || continue
  [ "$old" = "$out" ] || [ ! -d "$old" ] || rm -rf "$old"
done
echo "e2e/k8s/build.sh: built in $(($(date +%s) - started)) s" >&2
echo "$out"
