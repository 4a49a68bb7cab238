#!/usr/bin/env bash
# Builds and runs PDPair's images here, without a Docker engine or a registry (docs/images.md):
#   hack/images.sh build TARGET...         builds localhost/pdpair-TARGET:local from the Dockerfile
#   hack/images.sh run TARGET [ARG...]     runs the image's entry point with ARGs, as uid 65532
# TARGET: operator, agent or agent-cuda (the targets whose base, PYTHON_IMAGE, is replaced here).
#
# How, on a machine with no daemon and no registry access:
# - The base: a Debian trixie root filesystem made by mmdebstrap (Python, venv, headers: what the
#   python:*-slim image the Dockerfile names by default provides), cached as a tarball under
#   ~/.cache/pdpair/images/ named for the hash of its inputs, and given to the build as PYTHON_IMAGE.
# - buildah builds with chroot isolation (an OCI runtime cannot set rlimits here) and never pulls.
#   Its storage, layers included, is ~/.cache/pdpair/images/storage, so an unchanged step is reused.
# - pip inside reaches the index the machine's pip uses: its settings (`pip config list`, PIP_* variables)
#   become the build's `pip.conf` secret, its CA bundle (pip's `cert`, else the system's) `pip-cert`.
# - pip's cache is the Dockerfile's cache mount, under ~/.cache/pdpair/images/tmp (buildah's TMPDIR).
# Needs root, buildah and mmdebstrap (hack/ci-buildah.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${PDPAIR_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdpair/images}"
SUITE=trixie
MIRROR="${PDPAIR_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=ca-certificates,python3,python3-venv,python3-dev,python-is-python3
TARGETS=(operator agent agent-cuda)
TAG=local
STEP_TIMEOUT="${PDPAIR_IMAGES_TIMEOUT:-1800}"

die() { echo "images: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root: buildah's chroot builds need it (or build with docker: docs/images.md)"
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || die "$tool is missing: run hack/ci-buildah.sh (Debian: apt-get install buildah mmdebstrap)"
done
mkdir -p "$CACHE/tmp"
export TMPDIR="$CACHE/tmp"
# One build or run at a time on this cache (a second waits, bounded).
exec 9>"$CACHE/lock"
flock -w "$STEP_TIMEOUT" 9 || die "another hack/images.sh held $CACHE/lock for ${STEP_TIMEOUT}s"
RUNROOT="/run/pdpair-images/$(printf %s "$CACHE" | sha256sum | cut -c1-12)"
bh() { timeout "$STEP_TIMEOUT" buildah --root "$CACHE/storage" --runroot "$RUNROOT" "$@"; }

is_target() { local t; for t in "${TARGETS[@]}"; do [ "$t" = "$1" ] && return 0; done; return 1; }

# The base image, localhost/pdpair-base:KEY, KEY the hash of everything that makes the tarball.
base_image() {
  local key tar
  key=$(printf '%s\n' "$SUITE" "$MIRROR" "$PACKAGES" minbase "$(dpkg --print-architecture)" \
        "$(mmdebstrap --version)" | sha256sum | cut -c1-16)
  tar="$CACHE/base-$SUITE-$key.tar"
  if bh inspect --type image "localhost/pdpair-base:$key" >/dev/null 2>&1; then
    echo "localhost/pdpair-base:$key"; return
  fi
  if [ ! -f "$tar" ] || [ ! -s "$tar" ]; then
    echo "images: making the $SUITE base with mmdebstrap ($PACKAGES)" >&2
    rm -rf "$tar.part"
    timeout "$STEP_TIMEOUT" mmdebstrap --quiet --format=tar --variant=minbase --include="$PACKAGES" \
      "$SUITE" "$tar.part" "$MIRROR" >&2
    rm -rf "$tar"
    mv "$tar.part" "$tar"
  fi
  local ctr
  ctr=$(bh from scratch)
  bh add --quiet "$ctr" "$tar" / >/dev/null
  bh config --env LANG=C.UTF-8 --cmd python3 "$ctr"
  bh commit --quiet --rm "$ctr" "localhost/pdpair-base:$key" >/dev/null
  echo "localhost/pdpair-base:$key"
}

# The machine's pip settings as a pip.conf, its CA bundle beside it (pip.conf names it by its secret path).
pip_secrets() {
  local dir=$1
  python3 - "$dir" <<'PY'
import ast, os, ssl, subprocess, sys
from pathlib import Path

out = Path(sys.argv[1])
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                        timeout=60).stdout if subprocess.run([sys.executable, "-m", "pip", "--version"],
                        capture_output=True, timeout=60).returncode == 0 else ""
keep = ("index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout", "retries", "proxy",
        "find-links", "cert")
settings: dict[str, str] = {}
for line in listed.splitlines():  # scope.key='value'; later lines (environment) win
    name, sep, value = line.partition("=")
    key = name.rpartition(".")[2]
    if sep and key in keep:
        settings["timeout" if key == "default-timeout" else key] = ast.literal_eval(value)
for key in keep:  # PIP_* variables: `pip config list` shows them, but only for the pip it ran
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env:
        settings["timeout" if key == "default-timeout" else key] = env
# A local find-links folder is not in the build; an index URL is.
if "://" not in settings.get("find-links", "://"):
    settings.pop("find-links")
cert = settings.pop("cert", None) or ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
if Path(cert).is_file():
    (out / "pip-cert").write_bytes(Path(cert).read_bytes())
    settings["cert"] = "/run/secrets/pip-cert"
else:
    (out / "pip-cert").write_bytes(b"")
lines = ["[global]"] + [f"{k} = {v}" for k, v in sorted(settings.items())]
(out / "pip.conf").write_text("\n".join(lines) + "\n")
PY
}

build() {
  [ $# -gt 0 ] || die "name a target: hack/images.sh build ${TARGETS[*]}"
  local t
  for t in "$@"; do is_target "$t" || die "unknown target '$t': one of ${TARGETS[*]} (others build on CI: docs/images.md)"; done
  # Storage is bounded: past PDPAIR_IMAGES_MAX_GB (default 16; a new commit adds ~1.5 GB of layers) every
  # image but the base goes before this build, which then reinstalls the dependencies (bounding after it
  # would remove the images it just built). Not pruned per build: a
  # stage used only through COPY --from (build-agent) is no tagged image's parent, so a prune would drop
  # the layers that make the next build warm.
  local used
  used=$(du -sk "$CACHE/storage" 2>/dev/null | cut -f1)
  if [ "${used:-0}" -gt $(( ${PDPAIR_IMAGES_MAX_GB:-16} * 1024 * 1024 )) ]; then
    echo "images: storage at $(( used / 1024 / 1024 )) GB: removing every image but the base" >&2
    bh images --all --format '{{.ID}} {{.Name}}' | awk '$2 != "localhost/pdpair-base" {print $1}' | sort -u \
      | xargs -r -n 64 buildah --root "$CACHE/storage" --runroot "$RUNROOT" rmi --force >/dev/null 2>&1 || true
  fi
  local base
  base=$(base_image)
  secrets=$(mktemp -d "$CACHE/tmp/secrets.XXXXXX")
  trap 'rm -rf "$secrets"' EXIT
  pip_secrets "$secrets"
  local attempt rc log="$secrets/bud.log"
  for t in "$@"; do
    # buildah re-executes itself from a sealed memfd copy for each RUN; on these VMs sealing now and then
    # fails with EBUSY (a page of the copy still referenced). That step, and only that error, is tried
    # again, at most twice; the finished layers are reused.
    for attempt in 1 2 3; do
      echo "images: building $t on $base" >&2
      rc=0
      bh bud --isolation chroot --layers --pull=never --target "$t" \
        --build-arg "PYTHON_IMAGE=$base" \
        --secret "id=pip.conf,src=$secrets/pip.conf" --secret "id=pip-cert,src=$secrets/pip-cert" \
        -t "localhost/pdpair-$t:$TAG" -f Dockerfile . 2>&1 | tee "$log" >&2 || rc=$?
      [ "$rc" = 0 ] && break
      grep -q "sealing memfd copy: Device or resource busy" "$log" && [ "$attempt" -lt 3 ] || exit "$rc"
      echo "images: buildah could not seal its memfd copy (EBUSY); building $t again" >&2
    done
  done
}

run() {
  [ $# -gt 0 ] || die "name a target: hack/images.sh run TARGET [ARG...]"
  local t=$1; shift
  is_target "$t" || die "unknown target '$t': one of ${TARGETS[*]}"
  bh inspect --type image "localhost/pdpair-$t:$TAG" >/dev/null 2>&1 \
    || die "no image localhost/pdpair-$t:$TAG: build it first (hack/images.sh build $t)"
  local ctr entry user rc=0
  ctr=$(bh from --pull=never "localhost/pdpair-$t:$TAG")
  entry=$(bh inspect --type container --format '{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}' "$ctr")
  user=$(bh inspect --type container --format '{{.OCIv1.Config.User}}' "$ctr")
  # shellcheck disable=SC2086  # the entry point is one word per element (no spaces in them)
  bh run --isolation chroot --user "$user" "$ctr" -- $entry "$@" || rc=$?
  bh rm "$ctr" >/dev/null
  return "$rc"
}

case "${1:-}" in
  build) shift; build "$@" ;;
  run) shift; run "$@" ;;
  *) die "usage: hack/images.sh build TARGET... | run TARGET [ARG...] (TARGET: ${TARGETS[*]})" ;;
esac
