"""The module closure of the sglang GPU test's own process, recorded on a CPU run of the same flow.

Runs ``tests/integration/test_sglang_backend.py``'s per-family byte test in this process (sglang's
``load_plugins()``, the pdpair classes, sglang's pool classes, ``KVArgs``, ``ServerArgs``, the agents as
subprocesses), then writes one line per imported module that lives outside the standard library:
``sglang <module> <file>`` for sglang's own files, ``dist <distribution> <module>`` for third-party ones
(the distribution that installed it). ``hack/sglang-device-site.sh`` builds the device's carry folder
from this list. Usage: ``python hack/sglang_closure.py OUT.txt``.
"""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
from pathlib import Path

import pytest


def main(out: str) -> int:
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-k", "every_byte",
                      "tests/integration/test_sglang_backend.py"])
    if rc != 0:
        print(f"the recording run failed (pytest exit {rc}); no closure written", file=sys.stderr)
        return 1
    stdlib = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}
    repo = Path.cwd().resolve()
    dists = importlib.metadata.packages_distributions()
    lines = set()
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if path.is_relative_to(repo) or any(path.is_relative_to(s) and "site-packages" not in path.parts
                                             for s in stdlib):
            continue
        top = name.split(".")[0]
        if top == "sglang":
            lines.add(f"sglang {name} {file}")
        else:
            for dist in dists.get(top, [top]):
                lines.add(f"dist {dist} {name}")
    Path(out).write_text("".join(sorted(f"{line}\n" for line in lines)))
    print(f"{len(lines)} modules -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
