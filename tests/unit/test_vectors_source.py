"""The golden vectors are sglang 0.5.23's own output.

``tests/vectors/regenerate.py`` recomputes every case with sglang's functions cut out of its wheel; the
committed file must be exactly what that produces. Without the wheel (no package index reachable and
nothing cached) the comparison cannot run and says so."""

from __future__ import annotations

import importlib.util
import json

import pytest
from codec_vectors import VECTORS, VECTORS_PATH

from dataplane.harness.bench import sglang_ref


def _regenerate_module():
    spec = importlib.util.spec_from_file_location("regenerate", VECTORS_PATH.with_name("regenerate.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_vectors_are_what_sglang_produces() -> None:
    try:
        ref = sglang_ref.load()
    except sglang_ref.ReferenceUnavailable as exc:
        pytest.skip(f"sglang {sglang_ref.SGLANG_VERSION} wheel unavailable: {exc}")
    regen = _regenerate_module()
    assert regen.render(regen.regenerate(ref, VECTORS)) == VECTORS_PATH.read_text()


def test_every_case_names_its_source() -> None:
    for section, cases in VECTORS.items():
        if section == "about":
            continue
        assert cases, section
        for case in cases:
            assert case["source"].startswith("sglang 0.5.23 python/sglang/srt/disaggregation/"), case


def test_a_changed_output_is_caught() -> None:
    """The comparison is byte for byte: one flipped frame differs from the committed file."""
    regen = _regenerate_module()
    tampered = json.loads(VECTORS_PATH.read_text())
    tampered["registration"][0]["frames_hex"][1] = b"0".hex()
    assert regen.render(tampered) != VECTORS_PATH.read_text()
