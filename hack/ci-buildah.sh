#!/usr/bin/env bash
# Installs Debian's buildah and mmdebstrap for the image test (tests/integration/test_images.py,
# hack/images.sh) if they are not already there.
set -euo pipefail
if command -v buildah >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1; then exit 0; fi
echo "ci-buildah: installing Debian's buildah and mmdebstrap" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq buildah mmdebstrap >/dev/null
buildah --version >&2
