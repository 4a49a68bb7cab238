"""Our schema manifest: one extra trailing registration frame that says what the sglang frames cannot —
component names, state types, dtypes, TP dimensions and a format version — so two agents can refuse an
incompatible peer instead of misparsing its memory.

Frame = ``MANIFEST_MAGIC`` (``b"PDPM"``) + one version byte + msgpack of ``Manifest``. The magic makes it
impossible to confuse with any sglang frame; the version byte changes only when the framing does, while
the Struct evolves by msgspec's rules (new fields get defaults).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from ..errors import SchemaError, WireFormatError
from ..schema import RoleSchema, canonical_state_type, state_type

MANIFEST_MAGIC = b"PDPM"
MANIFEST_VERSION = 1
_PREFIX = MANIFEST_MAGIC + bytes([MANIFEST_VERSION])

Role = Literal["prefill", "decode"]
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]
Name = Annotated[str, msgspec.Meta(max_length=256)]


class KVSummary(msgspec.Struct, frozen=True):
    item_len: Positive
    dtype: Name
    layout: Literal["mha", "mla"]
    num_layers: NonNeg
    """Number of KV buffers (sglang's ``kv_layer_ids`` count; K and V count separately for MHA)."""
    layer_ids: tuple[NonNeg, ...] = ()
    """Each KV buffer's layer id (empty: not told)."""


class ComponentSummary(msgspec.Struct, frozen=True):
    name: Name
    state_type: Name
    """Stored under its current name: sglang's older ``nsa`` arrives as ``dsa``."""
    dtype: Name
    item_lens: tuple[Positive, ...]
    tp_dims: tuple[NonNeg, ...]
    """Per tensor, the size on this rank of the dimension TP splits; 0 = replicated."""
    num_items: Positive
    layer_ids: tuple[NonNeg, ...] = ()
    """Per tensor, its layer id (empty: not told)."""
    outer_counts: tuple[Positive, ...] = ()
    """Per tensor, the leading blocks outside the split dimension (empty: 1 each)."""
    conv_shard_groups: tuple[tuple[Positive, ...], ...] = ()
    """Per tensor, GDN conv state's sub-block sizes split by TP separately (empty: a plain split)."""

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "state_type", canonical_state_type(self.state_type))


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """What one rank of one role holds, as the peer needs to know it."""

    format_version: Positive = MANIFEST_VERSION
    role: Role
    model: Name
    tp_size: Positive
    tp_rank: NonNeg
    page_size: Positive
    kv: KVSummary
    components: tuple[ComponentSummary, ...] = ()
    generation: Name = ""
    """Rollout generation (e.g. a hash of the deployment spec); peers of different generations refuse."""
    aux_item_lens: tuple[Positive, ...] = ()
    """Bytes of one item of each aux buffer (empty: not told)."""
    aux_num_items: NonNeg = 0


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Manifest)


def is_manifest_frame(frame: bytes) -> bool:
    return bytes(frame[: len(MANIFEST_MAGIC)]) == MANIFEST_MAGIC


def _validate(m: Manifest) -> Manifest:
    """Checks msgspec's type constraints cannot express; unknown state types raise UnknownStateType."""
    if m.tp_size & (m.tp_size - 1) or m.tp_rank >= m.tp_size:
        raise WireFormatError(f"manifest: tp_rank {m.tp_rank} / tp_size {m.tp_size} invalid")
    for i, comp in enumerate(m.components):
        state_type(comp.state_type)
        if len(comp.item_lens) != len(comp.tp_dims) or not comp.item_lens:
            raise WireFormatError(
                f"manifest: component {i} (`{comp.name}`) has {len(comp.item_lens)} item lens "
                f"but {len(comp.tp_dims)} tp dims"
            )
        for field in ("layer_ids", "outer_counts", "conv_shard_groups"):
            n = len(getattr(comp, field))
            if n and n != len(comp.item_lens):
                raise WireFormatError(
                    f"manifest: component {i} (`{comp.name}`) has {n} {field} "
                    f"for {len(comp.item_lens)} tensors"
                )
    if m.kv.layer_ids and len(m.kv.layer_ids) != m.kv.num_layers:
        raise WireFormatError(
            f"manifest: {len(m.kv.layer_ids)} kv layer ids for {m.kv.num_layers} kv buffers"
        )
    names = [c.name for c in m.components]
    if len(set(names)) != len(names):
        raise WireFormatError(f"manifest: component names must be unique, got {names}")
    return m


def encode_manifest(m: Manifest) -> bytes:
    return _PREFIX + _ENCODER.encode(_validate(m))


def decode_manifest(frame: bytes) -> Manifest:
    """Parse our trailing frame; raises ``WireFormatError`` or ``UnknownStateType``."""
    frame = bytes(frame)
    if not is_manifest_frame(frame):
        raise WireFormatError(f"manifest: missing magic {MANIFEST_MAGIC!r}, got {frame[:8]!r}")
    if len(frame) <= len(MANIFEST_MAGIC):
        raise WireFormatError("manifest: truncated after the magic (no version byte)")
    version = frame[len(MANIFEST_MAGIC)]
    if version != MANIFEST_VERSION:
        raise WireFormatError(
            f"manifest: framing version {version} not supported (this agent speaks {MANIFEST_VERSION})"
        )
    try:
        m = _DECODER.decode(frame[len(_PREFIX) :])
    except msgspec.MsgspecError as exc:
        raise WireFormatError(f"manifest: {exc}") from None
    return _validate(m)


def manifest_from_schema(schema: RoleSchema, *, role: Role, generation: str = "") -> Manifest:
    """The manifest of one rank, straight from its ``RoleSchema``."""
    if role not in ("prefill", "decode"):
        raise SchemaError(f"role must be 'prefill' or 'decode', got {role!r}")
    kv = schema.kv
    return Manifest(
        role=role,
        model=schema.model,
        tp_size=schema.tp_size,
        tp_rank=schema.tp_rank,
        page_size=kv.page_size,
        kv=KVSummary(
            item_len=kv.item_len, dtype=kv.dtype, layout=kv.layout, num_layers=len(kv.layer_ids),
            layer_ids=tuple(kv.layer_ids),
        ),
        components=tuple(
            ComponentSummary(
                name=c.name,
                state_type=c.state_type,
                dtype=c.dtype,
                item_lens=tuple(t.item_len for t in c.tensors),
                tp_dims=tuple(t.tp_dim for t in c.tensors),
                num_items=c.num_items,
                layer_ids=tuple(t.layer_id for t in c.tensors),
                outer_counts=tuple(t.outer_count for t in c.tensors),
                conv_shard_groups=tuple(tuple(t.conv_shard_groups) for t in c.tensors),
            )
            for c in schema.components
        ),
        generation=generation,
        aux_item_lens=tuple(schema.aux.item_lens),
        aux_num_items=schema.aux.num_items,
    )
