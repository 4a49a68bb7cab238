"""The repository as a suite that runs from any checkout: nothing it runs reads outside the checkout,
and no two test modules share a basename (pytest imports them by basename, and the second fails to
collect)."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tracked(*patterns: str) -> list[str]:
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()


# A path that leaves the checkout: the parent folder's shared material, or an absolute path into the
# machine's work folders. Tests, tools and benchmarks must run from a clone in any folder.
_OUTSIDE = re.compile(r"""\.\./shared\b|["']/work/|parents\[[3-9]\]\s*/\s*["']shared""")


def test_nothing_reads_outside_the_checkout() -> None:
    files = tracked("*.py", "*.sh", "Makefile", "scripts/*", ".ci/*", "hack/*")
    me = Path(__file__).relative_to(REPO).as_posix()
    hits = [
        f"{name}:{n}: {line.strip()}"
        for name in files if name != me and (REPO / name).is_file()
        for n, line in enumerate((REPO / name).read_text(errors="replace").splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert not hits, "reads outside the checkout:\n" + "\n".join(hits)


def test_no_two_test_modules_share_a_basename() -> None:
    names = Counter(Path(f).name for f in tracked("tests/*.py") if Path(f).name.startswith("test_"))
    assert not [n for n, k in names.items() if k > 1], names.most_common(3)
