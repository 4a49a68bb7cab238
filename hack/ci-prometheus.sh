#!/usr/bin/env bash
# Installs Debian's Prometheus server for the dashboard panel test
# (tests/integration/test_dashboards_prometheus.py) if it is not already there.
# The package's service is never started: the test runs its own server on 127.0.0.1.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then exit 0; fi
echo "ci-prometheus: installing Debian's prometheus package" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d 101: keep the package's postinst from starting a system-wide server.
policy=/usr/sbin/policy-rc.d
created=0
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; created=1; fi
trap '[ "$created" = 1 ] && rm -f "$policy"' EXIT
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
prometheus --version 2>&1 | head -1 >&2
