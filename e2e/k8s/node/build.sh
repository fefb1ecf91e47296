#!/usr/bin/env bash
# Builds the programs of a real lab node from pinned Go modules: kubelet and kube-proxy (kube/,
# the same k8s.io/kubernetes release as the control plane, stamped the same way), containerd with
# its runc shim and ctr, the CNI plugins bridge, host-local, loopback and portmap, and crictl
# (runtime/), and the Pod sandboxes' `pause` from the same Kubernetes module's C source (the
# lab builds its image: no registry is reachable). runc comes from Debian. Prints the folder that
# holds the programs (the CNI plugins in its cni/ folder). Needs Go, the Go module proxy and a C
# compiler with a static libc (gcc, libc6-dev, as Rust's own build needs).
#
# The folder is in a cache outside the repository ($SWIMLB_K8S_NODE_CACHE, default
# /var/cache/swimlb-k8s-node, or ~/.cache/swimlb-k8s-node where that is not writable), named after
# a hash of the pinned modules and of this script, so a second run builds nothing and a change of
# pin builds anew. It is not e2e/k8s/build.sh's cache: that script removes every other build in
# its own. On a 2-core machine shared with other builds, about 3 minutes after the control
# plane's build (which leaves most of Kubernetes compiled).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SWIMLB_K8S_NODE_CACHE:-/var/cache/swimlb-k8s-node}"
if [ -z "${SWIMLB_K8S_NODE_CACHE:-}" ] && ! { mkdir -p "$cache" && [ -w "$cache" ]; } 2>/dev/null; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/swimlb-k8s-node"
fi

if ! command -v go >/dev/null 2>&1; then
  echo "e2e/k8s/node/build.sh: no Go toolchain (go) on PATH: the lab's real nodes need it" >&2
  exit 1
fi

# Tests that need the programs start in parallel: one builds, the others wait for it here.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key=$(cat "$0" "$here"/kube/go.mod "$here"/kube/go.sum \
  "$here"/runtime/go.mod "$here"/runtime/go.sum | sha256sum | cut -c1-16)
out="$cache/$key"
programs=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr crictl pause
  cni/bridge cni/host-local cni/loopback cni/portmap)

built=1
for p in "${programs[@]}"; do
  [ -x "$out/$p" ] || built=0
done
if [ "$built" -eq 1 ]; then
  echo "$out"
  exit 0
fi

export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/cni"
started=$(date +%s)
pin() { awk -v m="$1" '$1 == m { print $2 }' "$2"; }

echo "e2e/k8s/node/build.sh: building kubelet and kube-proxy into $out" >&2
# The release's version, stamped as Kubernetes' own build stamps it (the Node's
# status.nodeInfo.kubeletVersion), as e2e/k8s/build.sh stamps the control plane.
version=$(pin k8s.io/kubernetes "$here/kube/go.mod")
minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd "$here/kube" && go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
# pause, as Kubernetes' build/pause/Makefile compiles it (static, its version from the Makefile).
kube_dir=$(cd "$here/kube" && go list -mod=readonly -m -f '{{.Dir}}' k8s.io/kubernetes)
pause_tag=$(awk '$1 == "TAG" && $2 == "?=" { print $3 }' "$kube_dir/build/pause/Makefile")
cc -Os -Wall -Werror -static -DVERSION="v$pause_tag" -o "$tmp/pause" \
  "$kube_dir/build/pause/linux/pause.c"
echo "$pause_tag" >"$tmp/pause.version"

echo "e2e/k8s/node/build.sh: building containerd, the CNI plugins and crictl" >&2
# Static programs without cgo (containerd then leaves out only its btrfs snapshotter), each
# stamped with its module's version: the kubelet reports containerd's as the Node's
# status.nodeInfo.containerRuntimeVersion.
ctrd=$(pin github.com/containerd/containerd/v2 "$here/runtime/go.mod")
cni=$(pin github.com/containernetworking/plugins "$here/runtime/go.mod")
cri=$(pin sigs.k8s.io/cri-tools "$here/runtime/go.mod")
export CGO_ENABLED=0
(cd "$here/runtime" &&
  go build -mod=readonly -trimpath -o "$tmp/" \
    -ldflags="-s -X github.com/containerd/containerd/v2/version.Version=$ctrd" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr &&
  go build -mod=readonly -trimpath -o "$tmp/cni/" \
    -ldflags="-s -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni" \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/meta/portmap &&
  go build -mod=readonly -trimpath -o "$tmp/" \
    -ldflags="-s -X sigs.k8s.io/cri-tools/pkg/version.Version=$cri" \
    sigs.k8s.io/cri-tools/cmd/crictl)

mkdir -p "$out/cni"
for p in "${programs[@]}" pause.version; do
  mv "$tmp/$p" "$out/$p"
done
# Builds of older pins are not used again.
for old in "$cache"/*; do
  [ "$old" = "$out" ] || [ ! -d "$old" ] || rm -rf "$old"
done
echo "e2e/k8s/node/build.sh: built in $(($(date +%s) - started)) s" >&2
echo "$out"
