#!/usr/bin/env bash
# Builds kube-score (github.com/zegl/kube-score, pinned in versions.env) from the Go module proxy into
# a cache outside the repository, keyed by version, as build-k8s.sh does for the Kubernetes binaries;
# builds only when missing. The kube-score test (tests/integration/test_kube_score.py) runs it.
#
#   hack/build-kube-score.sh             build it if missing
#   hack/build-kube-score.sh --print-path  print the binary's path and exit
#
# Binary: ${XDG_CACHE_HOME:-$HOME/.cache}/pdpair/kube-score/<version>/kube-score
set -euo pipefail

HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HACK/versions.env"
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/pdpair/kube-score/${KUBE_SCORE_VERSION}"
BIN="$DIR/kube-score"
PKG=github.com/zegl/kube-score/cmd/kube-score

log() { printf '[build-kube-score %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

case "${1:-}" in
  --print-path) echo "$BIN"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-path]" >&2; exit 2 ;;
esac
if [[ -x "$BIN" ]]; then log "cached kube-score ${KUBE_SCORE_VERSION}"; exit 0; fi
command -v go >/dev/null || { log "ERROR: go not found on PATH"; exit 2; }
if ! grep -Eq "^[[:space:]]*github\.com/zegl/kube-score ${KUBE_SCORE_VERSION//./\\.}( |$)" "$HACK/kube-score/go.mod"; then
  log "ERROR: hack/kube-score/go.mod does not require github.com/zegl/kube-score ${KUBE_SCORE_VERSION} (hack/versions.env)"
  exit 2
fi
mkdir -p "$DIR"
tmp="$DIR/.kube-score.tmp.$$"
trap 'rm -f "$tmp"' EXIT
log "building kube-score ${KUBE_SCORE_VERSION} from $PKG (hack/kube-score) ..."
start=$(date +%s)
(cd "$HACK/kube-score" && CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly" \
   nice -n 10 go build -ldflags "-s -w -X main.version=${KUBE_SCORE_VERSION}" -o "$tmp" "$PKG")
mv -f "$tmp" "$BIN"
log "built kube-score in $(( $(date +%s) - start ))s: $BIN"
