#!/usr/bin/env bash
# Reserves 2 MiB huge pages for the tests of the sidecar's huge-page pools (tests/unit/
# test_localapi_shm.py), as a Kubernetes node does for containers that request hugepages-2Mi.
# Only raises the reservation (to 64 pages, 128 MiB), and only where the kernel lets this user;
# elsewhere the tests that need the pages say so and are skipped.
set -euo pipefail
knob=/proc/sys/vm/nr_hugepages
want=64
[ -r "$knob" ] || exit 0
have=$(cat "$knob")
if [ "$have" -ge "$want" ]; then exit 0; fi
if [ -w "$knob" ] && echo "$want" > "$knob" 2>/dev/null; then
  echo "ci-hugepages: reserved $(cat "$knob") huge pages of 2 MiB (was $have)" >&2
else
  echo "ci-hugepages: cannot reserve huge pages here (have $have); their tests will be skipped" >&2
fi
