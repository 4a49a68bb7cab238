#!/usr/bin/env bash
# Builds a Python 3.12 site for the sglang GPU test on a machine with no package index (the H200 device:
# Python 3.12, torch 2.11 + CUDA 13, numba, transformers 5.x, triton, ... but no sglang and few of its
# imports). Usage, from the repository root, with the suite's venv (sglang 0.5.23 installed):
#   hack/sglang-device-site.sh OUT_DIR
# 1. records the module closure of the test's own process (hack/sglang_closure.py, a CPU run of the
#    same flow), 2. copies sglang's files of that closure (python sources; its .so files are cp311 and
#    must not be needed) plus the sglang modules those files import lazily (inside functions; the CUDA
#    branches), 3. downloads cp312 manylinux wheels (--no-deps) of every third-party distribution in
#    the closure that the device image lacks, at the version installed here, and unpacks them.
# On the device: PDPAIR_SGLANG_CPU_KERNELS=1 PYTHONPATH=$PWD/OUT_DIR:$PWD:$PWD/operator \
#   python3 -m pytest -q -s --noconftest tests/integration/test_sglang_backend_gpu.py
set -euo pipefail
out=${1:?usage: hack/sglang-device-site.sh OUT_DIR}
py=${PYTHON:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# closure.txt is kept beside the site (OUT_DIR.closure.txt): the exact list, for review
rm -rf "$out" && mkdir -p "$out"
PYTHONPATH=$PWD:$PWD/operator "$py" hack/sglang_closure.py "$work/closure.txt" >"$work/record.log" 2>&1 \
  || { tail -20 "$work/record.log"; exit 1; }
cp "$work/closure.txt" "$out.closure.txt"
"$py" - "$work/closure.txt" "$out" "$work/dists.txt" <<'PY'
import ast, importlib.metadata as md, importlib.util, shutil, sys
from pathlib import Path

closure, out, dists_out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
# The device image's packages (/work/.library/device/KINDS.md, "Python packages already there", 2026-11-17).
DEVICE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cloudpickle cuda-bindings cuda-core cuda-pathfinder cuda-toolkit einops filelock frozenlist
fsspec h11 hf-xet httpcore httpx huggingface-hub idna jinja2 llvmlite markupsafe mpmath msgpack multidict networkx
numba numba-cuda numpy nvidia-ml-py packaging pandas pillow propcache protobuf psutil pyyaml regex requests rich
safetensors scipy sentencepiece setuptools six sympy tokenizers torch torchvision torchaudio tqdm transformers triton
typing-extensions urllib3 uvloop xxhash yarl zipp prometheus-client pygments markdown-it-py mdurl shellingham typer
pytest pluggy iniconfig hypothesis mypy-extensions sortedcontainers pytest-timeout typing-inspect
""".split())
norm = lambda n: n.lower().replace("_", "-")
root = None
sglang, dists = {}, set()
for line in closure.read_text().splitlines():
    kind, a, b = line.split(" ", 2)
    if kind == "sglang":
        sglang[a] = Path(b)
    elif not norm(a).startswith("nvidia-") and norm(a) not in DEVICE:
        dists.add(a)
site = Path(next(iter(sglang.values()))).resolve()
while site.name != "sglang":
    site = site.parent
site = site.parent

def lazy(path: Path) -> set[str]:
    """sglang modules a file imports inside functions (what a CPU run need not reach)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("sglang"):
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("sglang")}
    return names

files = {p.resolve() for p in sglang.values()}
for mod in sorted({m for p in list(files) if p.suffix == ".py" for m in lazy(p)}):
    parts = mod.split(".")
    for cand in (site.joinpath(*parts).with_suffix(".py"), site.joinpath(*parts, "__init__.py")):
        if cand.is_file():
            files.add(cand.resolve())
            for parent in cand.relative_to(site).parents[:-1]:  # every package on the way
                init = site / parent / "__init__.py"
                if init.is_file():
                    files.add(init.resolve())
# data folders sglang's code locates by path at import (sglang/kernels/jit/utils/compile/paths.py)
for data in ("sglang/kernels/jit/include", "sglang/kernels/jit/csrc"):
    files |= {f.resolve() for f in (site / data).rglob("*") if f.is_file() and f.suffix != ".so"}
# the pools' CUDA paths import kernel modules the CPU closure never reaches (MambaPool's fused copy
# warm-up imports sglang.kernels.ops.memory.ptr_table): every python source of both trees
for tree in ("sglang/kernels", "sglang/srt/mem_cache"):
    files |= {f.resolve() for f in (site / tree).rglob("*.py")}
so = sorted(str(f.relative_to(site)) for f in files if f.suffix == ".so")
if so:
    sys.exit(f"the closure needs compiled sglang modules (cp311 only): {so}")
for f in files:
    dest = out / f.relative_to(site)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, dest)
pins = []
for d in sorted(dists):
    try:
        pins.append(f"{d}=={md.version(d)}\n")
    except md.PackageNotFoundError:
        print(f"not carried (no installed distribution; pdpair's own editable finder, say): {d}")
dists_out.write_text("".join(pins))
print(f"{len(files)} sglang files; third-party distributions to carry: {' '.join(p.strip() for p in pins)}")
PY
mkdir -p "$work/wheels"
while read -r pin; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64 \
    -d "$work/wheels" "$pin"
done <"$work/dists.txt"
"$py" - "$work/wheels" "$out" <<'PY'
import sys, zipfile
from pathlib import Path
for whl in sorted(Path(sys.argv[1]).glob("*.whl")):
    zipfile.ZipFile(whl).extractall(sys.argv[2])
    print("unpacked", whl.name)
PY
# pdpair's entry point, as `pip install pdpair` would declare it (sglang's load_plugins() finds plugins
# by distribution metadata; the tree itself travels on PYTHONPATH)
ep="$out/pdpair-0.1.0.dist-info"
mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: pdpair\nVersion: 0.1.0\n' >"$ep/METADATA"
printf '[sglang.srt.plugins]\npdpair = dataplane.sglang:register\n' >"$ep/entry_points.txt"
du -sh "$out"
