"""``pdpair-agent wire``: encode/decode through ``dataplane.cli.main`` with captured stdin/stdout, and
once through the installed console script."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from codec_vectors import VECTORS

import dataplane.cli
import dataplane.commands.wire
from dataplane.codec import manifest_from_schema
from dataplane.schema import KVSpec, RoleSchema

REPO = Path(__file__).resolve().parents[2]
CASES = [("registration", c) for c in VECTORS["registration"]] + [
    ("metadata", c) for c in VECTORS["transfer_metadata"]
]


@pytest.fixture
def wire_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only this command group: the CLI must not depend on sibling command modules to test ``wire``."""
    monkeypatch.setattr(dataplane.cli, "COMMANDS", (dataplane.commands.wire,))


def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], stdin: Any
) -> tuple[int, Any, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(stdin)))
    rc = dataplane.cli.main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out else None), err


@pytest.mark.parametrize(("kind", "case"), CASES, ids=[f"{k}-{c['name']}" for k, c in CASES])
def test_encode_then_decode_matches_vectors(wire_only: None, monkeypatch, capsys, kind: str, case) -> None:
    rc, out, _ = run_cli(monkeypatch, capsys, ["wire", "encode", "--kind", kind], case["inputs"])
    assert rc == 0 and out == {"frames_hex": case["frames_hex"]}
    rc, decoded, _ = run_cli(monkeypatch, capsys, ["wire", "decode", "--kind", kind], out)
    assert rc == 0
    for field, expected in case["parsed_by_sglang"].items():
        assert decoded[field] == expected, field


def test_registration_with_manifest_prints_it_as_an_object(wire_only: None, monkeypatch, capsys) -> None:
    case = next(c for c in VECTORS["registration"] if c["name"] == "kv-only")
    schema = RoleSchema(
        model="m", tp_size=2, tp_rank=1, kv=KVSpec(item_len=4096, num_pages=8, layer_ids=(0, 1, 2, 3))
    )
    manifest = json.loads(msgspec.json.encode(manifest_from_schema(schema, role="decode", generation="g7")))
    rc, out, _ = run_cli(
        monkeypatch,
        capsys,
        ["wire", "encode", "--kind", "registration"],
        {**case["inputs"], "manifest": manifest},
    )
    assert rc == 0 and len(out["frames_hex"]) == 19
    rc, decoded, _ = run_cli(monkeypatch, capsys, ["wire", "decode", "--kind", "registration"], out)
    assert decoded["manifest"] == manifest and decoded["plain_sglang_peer"] is False
    assert decoded["engine_desc"] == case["inputs"]["engine_desc"]


@pytest.mark.parametrize(
    ("argv", "stdin", "needle"),
    [
        (["wire", "decode", "--kind", "metadata"], {"frames_hex": ["zz"]}, "not a hex string"),
        (["wire", "decode", "--kind", "registration"], {"frames_hex": []}, "guard"),
        (["wire", "decode", "--kind", "metadata"], {"frames": []}, "frames_hex"),
        (["wire", "encode", "--kind", "metadata"], {"room": "x"}, "stdin"),
        (
            ["wire", "encode", "--kind", "metadata"],
            {"room": 1, "local_ip": "h", "rank_port": 1, "engine_key": "k", "kv_indices": [2**40]},
            "dst_kv_indices: position 0",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(wire_only: None, monkeypatch, capsys, argv, stdin, needle) -> None:
    rc, out, err = run_cli(monkeypatch, capsys, argv, stdin)
    assert rc == 2 and out is None
    assert needle in err and "Traceback" not in err


def test_console_script_round_trip() -> None:
    case = next(c for c in VECTORS["transfer_metadata"] if c["name"] == "hybrid-mamba")
    exe = REPO / ".venv" / "bin" / "pdpair-agent"
    enc = subprocess.run(
        [str(exe), "wire", "encode", "--kind", "metadata"],
        input=json.dumps(case["inputs"]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    dec = subprocess.run(
        [str(exe), "wire", "decode", "--kind", "metadata"],
        input=enc.stdout,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    decoded = json.loads(dec.stdout)
    assert json.loads(enc.stdout)["frames_hex"] == case["frames_hex"]
    assert {k: decoded[k] for k in case["parsed_by_sglang"]} == case["parsed_by_sglang"]
