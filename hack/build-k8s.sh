#!/usr/bin/env bash
# Builds the local Kubernetes control plane from Go modules into a cache
# outside the repository, keyed by version; builds only what is missing.
#
#   hack/build-k8s.sh            build every missing binary
#   hack/build-k8s.sh --check    exit 1 (listing them) if any binary is missing
#   hack/build-k8s.sh --print-dir  print the bin/ directory and exit
#
# Binaries: ${XDG_CACHE_HOME:-$HOME/.cache}/pdpair/k8s/<kubernetes-version>/bin/
#   kube-apiserver kube-controller-manager kube-scheduler kubectl   (hack/k8s)
#   etcd (hack/etcd)   kwok (hack/kwok)   helm (hack/helm)
# Each binary has a stamp file bin/.<name>.version holding the module version
# it was built from; a binary whose stamp differs is rebuilt.
set -euo pipefail

HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HACK/versions.env"

BIN="${XDG_CACHE_HOME:-$HOME/.cache}/pdpair/k8s/${KUBERNETES_VERSION}/bin"
K8S_MAJOR_MINOR="${KUBERNETES_VERSION#v}"
K8S_MAJOR="${K8S_MAJOR_MINOR%%.*}"
K8S_MINOR="$(echo "$K8S_MAJOR_MINOR" | cut -d. -f2)"

# name | wrapper module dir | package | version | extra ldflags
K8S_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X ${pkg}.gitVersion=${KUBERNETES_VERSION}"
  K8S_LDFLAGS+=" -X ${pkg}.gitMajor=${K8S_MAJOR} -X ${pkg}.gitMinor=${K8S_MINOR}"
  K8S_LDFLAGS+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done
TARGETS=(
  "etcd|etcd|go.etcd.io/etcd/server/v3|${ETCD_VERSION}|"
  "kube-apiserver|k8s|k8s.io/kubernetes/cmd/kube-apiserver|${KUBERNETES_VERSION}|${K8S_LDFLAGS}"
  "kube-controller-manager|k8s|k8s.io/kubernetes/cmd/kube-controller-manager|${KUBERNETES_VERSION}|${K8S_LDFLAGS}"
  "kube-scheduler|k8s|k8s.io/kubernetes/cmd/kube-scheduler|${KUBERNETES_VERSION}|${K8S_LDFLAGS}"
  "kubectl|k8s|k8s.io/kubernetes/cmd/kubectl|${KUBERNETES_VERSION}|${K8S_LDFLAGS}"
  "kwok|kwok|sigs.k8s.io/kwok/cmd/kwok|${KWOK_VERSION}|"
  "helm|helm|helm.sh/helm/v4/cmd/helm|${HELM_VERSION}|-X helm.sh/helm/v4/internal/version.version=${HELM_VERSION}"
)

log() { printf '[build-k8s %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

is_current() {  # name version
  [[ -x "$BIN/$1" && -f "$BIN/.$1.version" && "$(cat "$BIN/.$1.version")" == "$2" ]]
}

check_pin() {  # wrapper-dir module version: the go.mod must require the pinned version
  local gomod="$HACK/$1/go.mod" mod="${2%/cmd/*}"
  [[ "$1" == k8s ]] && mod=k8s.io/kubernetes
  if ! grep -Eq "^[[:space:]]*(require[[:space:]]+)?${mod//./\\.} ${3//./\\.}( |$)" "$gomod"; then
    log "ERROR: $gomod does not require $mod $3 (hack/versions.env); update the wrapper module"
    exit 2
  fi
}

build_one() {  # name dir pkg version ldflags
  local name=$1 dir=$2 pkg=$3 version=$4 extra=$5 start tmp rc
  check_pin "$dir" "$pkg" "$version"
  tmp="$BIN/.$name.tmp.$$"
  log "building $name $version from $pkg (hack/$dir) ..."
  start=$(date +%s)
  set +e
  (cd "$HACK/$dir" && CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly" \
     nice -n 10 go build -ldflags "-s -w ${extra}" -o "$tmp" "$pkg") 2>&1 | sed 's/^/    /'
  rc=${PIPESTATUS[0]}
  set -e
  if [[ $rc -ne 0 ]]; then
    rm -f "$tmp"
    log "FAILED: $name (go build exit $rc, after $(( $(date +%s) - start ))s)"
    exit "$rc"
  fi
  mv -f "$tmp" "$BIN/$name"
  echo "$version" > "$BIN/.$name.version"
  log "built $name in $(( $(date +%s) - start ))s"
}

main() {
  case "${1:-}" in
    --print-dir) echo "$BIN"; return 0 ;;
    --check)
      local missing=()
      for t in "${TARGETS[@]}"; do IFS='|' read -r name _ _ version _ <<<"$t"
        is_current "$name" "$version" || missing+=("$name"); done
      if (( ${#missing[@]} )); then echo "missing: ${missing[*]}"; return 1; fi
      echo "all present in $BIN"; return 0 ;;
    "") ;;
    *) echo "usage: $0 [--check|--print-dir]" >&2; return 2 ;;
  esac
  command -v go >/dev/null || { log "ERROR: go not found on PATH"; exit 2; }
  mkdir -p "$BIN"
  local total_start built=0
  total_start=$(date +%s)
  log "cache: $BIN ($(go version))"
  for t in "${TARGETS[@]}"; do
    IFS='|' read -r name dir pkg version extra <<<"$t"
    if is_current "$name" "$version"; then log "cached $name $version"; continue; fi
    build_one "$name" "$dir" "$pkg" "$version" "$extra"
    built=$((built + 1))
  done
  log "done: built $built of ${#TARGETS[@]} in $(( $(date +%s) - total_start ))s"
}

main "$@"
