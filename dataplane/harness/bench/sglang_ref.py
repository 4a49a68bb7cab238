"""sglang 0.5.23's own helper functions, loaded for side-by-side comparison — never vendored.

The wheel is fetched at benchmark time with ``pip download sglang==0.5.23 --no-deps`` into a cache
directory; only the named top-level functions and classes (and a few methods of ``MoriKVManager``) are
cut out of their modules' source with ``ast`` and executed in a namespace that provides numpy, struct
and msgspec. sglang's modules import torch and half of the serving stack, so they are never imported:
a cut function's own ``from sglang… import`` lines are dropped, the names they import being cut too.
"""

from __future__ import annotations
import __future__

import ast
import dataclasses
import logging
import struct
import subprocess
import sys
import types
import typing
import zipfile
from collections import deque
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt

from ...errors import PDPairError

SGLANG_VERSION = "0.5.23"
DEFAULT_CACHE = Path.home() / ".cache" / "pdpair" / "sglang"
_BASE = "sglang/srt/disaggregation/"
NEEDED: dict[str, tuple[str, ...]] = {
    "common/utils.py": (
        "pack_list_of_buffers",
        "unpack_list_of_buffers",
        "pack_int_lists",
        "unpack_int_lists",
        "group_concurrent_contiguous",
    ),
    "common/staging_buffer.py": ("compute_head_slice_params",),
    "utils.py": (
        "should_send_replicated_state",
        "compute_mamba_state_slice_blocks",
        "compute_mamba_state_slice_byte_blocks",
        "build_transfer_entry_pairs",
    ),
    "mori/conn.py": (
        "_normalize_state_indices_per_component",
        "_pack_state_indices",
        "_unpack_state_indices",
        "_pack_mem_desc_list",
        "_unpack_mem_desc_list",
        "_pack_mem_desc_lists",
        "_unpack_mem_desc_lists",
        "TransferInfo",
        "KVArgsRegisterInfo",
        "GroupedIndexPlan",
        "BatchTransferPlan",
        "TPSliceConfig",
        "MoriKVManager._build_tp_slice_config",
        "MoriKVManager._build_tp_slice_transfer_plan",
        "MoriKVManager._send_mamba_state",
        "MoriKVManager.build_receiver_registration_message",
        "MoriKVManager.build_receiver_metadata_message",
    ),
}


class ReferenceUnavailable(PDPairError):
    """The sglang wheel could not be fetched or does not contain what the benchmark needs."""


class _OpaqueDesc:
    """Stands in for mori's EngineDesc/MemoryDesc: the blobs pass through unparsed (favours sglang)."""

    def __init__(self, blob: bytes, key: str = "") -> None:
        self.blob, self.key = blob, key

    def pack(self) -> bytes:
        return self.blob

    @staticmethod
    def unpack(blob: bytes) -> bytes:
        return blob


def wheel_path(cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The cached wheel, downloading it with pip on first use."""
    found = sorted(cache_dir.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        f"sglang=={SGLANG_VERSION}",
        "--no-deps",
        "-q",
        "-d",
        str(cache_dir),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    found = sorted(cache_dir.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if proc.returncode or not found:
        raise ReferenceUnavailable(
            f"pip download sglang=={SGLANG_VERSION} failed: {proc.stderr.strip()[-500:]}"
        )
    return found[0]


def _pick(tree: ast.Module, names: tuple[str, ...], source: str) -> list[ast.stmt]:
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    out: list[ast.stmt] = []
    for name in names:
        owner, _, method = name.partition(".")
        node = top.get(owner)
        if method and isinstance(node, ast.ClassDef):
            node = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == method), None)
        if node is None:
            raise ReferenceUnavailable(f"{source} has no {name}")
        out.append(_without_sglang_imports(node))
    return out


def _without_sglang_imports(node: ast.stmt) -> ast.stmt:
    """A function without its local ``from sglang… import`` lines (the names come from the namespace)."""
    if isinstance(node, ast.FunctionDef):
        node.body = [
            s
            for s in node.body
            if not (isinstance(s, ast.ImportFrom) and (s.module or "").startswith("sglang"))
        ]
    return node


class _Logger(logging.LoggerAdapter):
    """sglang's logger: the standard one plus the ``warning_once`` sglang patches onto it."""

    def warning_once(self, msg: str, *args: object) -> None:
        self.warning(msg, *args)


def load(cache_dir: Path = DEFAULT_CACHE) -> types.ModuleType:
    """A module holding only the needed sglang functions (methods become plain functions of ``self``)."""
    module = types.ModuleType(f"pdpair_sglang_ref_{SGLANG_VERSION.replace('.', '_')}")
    module.__dict__.update(
        np=np,
        deque=deque,
        npt=npt,
        struct=struct,
        msgspec=msgspec,
        dataclasses=dataclasses,
        logger=_Logger(logging.getLogger("sglang"), {}),
        MORI_GUARD=b"MoriMsgGuard",
        MemoryDesc=_OpaqueDesc,
        EngineDesc=_OpaqueDesc,
        OpaqueDesc=_OpaqueDesc,
        **{n: getattr(typing, n) for n in ("List", "Optional", "Tuple", "Sequence", "Union", "Dict", "Any")},
    )
    sys.modules[module.__name__] = module
    with zipfile.ZipFile(wheel_path(cache_dir)) as whl:
        for rel, names in NEEDED.items():
            source = whl.read(_BASE + rel).decode()
            body = _pick(ast.parse(source), names, rel)
            code = compile(
                ast.Module(body=body, type_ignores=[]),
                f"<sglang {SGLANG_VERSION} {rel}>",
                "exec",
                flags=__future__.annotations.compiler_flag,
                dont_inherit=True,
            )
            exec(code, module.__dict__)
    return module
