"""Fuzz the decoders with mutated golden frames (truncate, flip bytes, drop/duplicate frames, garbage):
every decoder either succeeds or raises ``BadInput`` — never struct.error, IndexError,
UnicodeDecodeError or a msgspec error."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from codec_vectors import VECTORS, frames_of, registration_from_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataplane.codec import (
    Abort,
    ComponentSummary,
    Hello,
    KVSummary,
    Manifest,
    decode_control,
    decode_manifest,
    decode_metadata,
    decode_registration,
    decode_status,
    encode_control,
    encode_registration,
    encode_status,
    unpack_int_lists,
)
from dataplane.codec.status import KVPoll, StatusMessage
from dataplane.errors import BadInput

_HYBRID = next(c for c in VECTORS["registration"] if c["name"] == "hybrid-mamba")
_MANIFEST = Manifest(
    role="decode",
    model="m",
    tp_size=2,
    tp_rank=1,
    page_size=64,
    kv=KVSummary(4096, "bfloat16", "mha", 2),
    components=(
        ComponentSummary("mamba", "mamba", "bfloat16", (6144, 1048576, 6144, 1048576), (3072, 16) * 2, 8),
    ),
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEEDS = (
    [frames_of(c) for c in VECTORS["registration"]]
    + [frames_of(c) for c in VECTORS["transfer_metadata"]]
    + [
        encode_registration(
            msgspec.structs.replace(registration_from_inputs(_HYBRID["inputs"]), manifest=_MANIFEST)
        )
    ]
    + [encode_status(StatusMessage(room=3, status=KVPoll.Failed, prefill_rank=1, failure_reason="x"))]
)
DECODERS: list[Callable[[Sequence[bytes]], Any]] = [
    decode_registration,
    decode_metadata,
    lambda f: decode_metadata(f, legacy_flat_state=True),
    decode_status,
]


def _mutate_frame(frame: bytes, data: st.DataObject) -> bytes:
    op = data.draw(st.sampled_from(["truncate", "flip", "extend", "replace", "keep"]))
    if op == "truncate":
        return frame[: data.draw(st.integers(0, max(len(frame) - 1, 0)))]
    if op == "flip" and frame:
        pos = data.draw(st.integers(0, len(frame) - 1))
        return frame[:pos] + bytes([frame[pos] ^ data.draw(st.integers(1, 255))]) + frame[pos + 1 :]
    if op == "extend":
        return frame + data.draw(st.binary(max_size=12))
    if op == "replace":
        return data.draw(st.sampled_from([b"", b"-1", b"None", b"\xff\xfe", b"9" * 23, b"\x90"]))
    return frame


def _mutate(frames: list[bytes], data: st.DataObject) -> list[bytes]:
    frames = list(frames)
    for _ in range(data.draw(st.integers(1, 4))):
        if not frames:
            break
        i = data.draw(st.integers(0, len(frames) - 1))
        op = data.draw(st.sampled_from(["frame", "frame", "drop", "dup", "cut"]))
        if op == "frame":
            frames[i] = _mutate_frame(frames[i], data)
        elif op == "drop":
            del frames[i]
        elif op == "dup":
            frames.insert(i, frames[i])
        else:
            frames = frames[:i]
    return frames


def _only_bad_input(fn: Callable[[Any], Any], arg: Any) -> None:
    with contextlib.suppress(BadInput):
        fn(arg)


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_frame_decoders_only_raise_bad_input(seed: list[bytes], data: st.DataObject) -> None:
    frames = _mutate(seed, data)
    for decode in DECODERS:
        _only_bad_input(decode, frames)


@FUZZ
@given(st.binary(max_size=64), st.sampled_from(["i", "I"]))
def test_unpack_int_lists_only_raises_bad_input(buf: bytes, fmt: str) -> None:
    _only_bad_input(lambda b: unpack_int_lists(b, fmt), buf)  # type: ignore[arg-type]


CONTROL_SEEDS = [
    encode_control(Hello(agent_id="a", role="decode", manifest=b"PDPM")),
    encode_control(Abort(room=1, reason="r")),
    b"PDPM\x01"
    + msgspec.msgpack.encode(
        {
            "role": "decode",
            "model": "m",
            "tp_size": 2,
            "tp_rank": 0,
            "page_size": 64,
            "kv": {"item_len": 1, "dtype": "bfloat16", "layout": "mha", "num_layers": 1},
        }
    ),
]


@FUZZ
@given(st.sampled_from(CONTROL_SEEDS), st.data())
def test_control_and_manifest_decoders_only_raise_bad_input(seed: bytes, data: st.DataObject) -> None:
    payload = _mutate_frame(seed, data)
    _only_bad_input(decode_control, payload)
    _only_bad_input(decode_manifest, payload)
