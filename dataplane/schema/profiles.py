"""Built-in model profiles as data: one table row per model, turned into a ``RoleSchema`` for a rank.

Profiles are the synthetic source's and engine's only: a serving engine registers its own pools, and
those define the layout at their real size. Each profile is its model's real layout per token — head
counts, head dims and dtypes from the public model configs — with its layer pattern (every
``full_every``-th layer is full attention, with KV; the others carry a hybrid state: Mamba/GDN slots or
SWA pages) and the paged state components beside KV. A demo or a test keeps its memory and run time
small by counts alone: the model's first ``layers`` layers, the pool's pages and the request slots; no
dimension is ever shrunk. Adding a model is one ``Profile(...)`` entry in ``PROFILES``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ..config import AgentConfig, ComponentConfig
from ..errors import SchemaError
from .types import DTYPE_BYTES, AuxSpec, Component, KVSpec, RoleSchema, TensorSpec

__all__ = [
    "PROFILES",
    "GDNDims",
    "PagedDims",
    "PagedState",
    "Profile",
    "profile",
    "profile_names",
    "schema_from_config",
]

Which = Literal["full", "hybrid"]


@dataclass(frozen=True)
class PagedDims:
    """Per-token dims of a paged buffer: ``heads x head_dim`` elements (+ ``extra_bytes``) per token."""

    heads: int
    head_dim: int
    dtype: str = "bfloat16"
    split: bool = True
    """Heads are split by TP (MHA); False for replicated state (MLA latent, DSA index keys)."""
    extra_bytes: int = 0
    """Bytes per token after the elements (e.g. an fp8 quantisation scale)."""

    def token_bytes(self, tp_size: int) -> int:
        heads = max(1, self.heads // tp_size) if self.split else self.heads
        return heads * self.head_dim * DTYPE_BYTES[self.dtype] + self.extra_bytes


@dataclass(frozen=True)
class PagedState:
    """A paged state component: ``tensors_per_layer`` buffers for each layer of kind ``layers``."""

    name: str
    state_type: str
    dims: PagedDims
    layers: Which = "full"
    tensors_per_layer: int = 1


@dataclass(frozen=True)
class GDNDims:
    """Gated DeltaNet (Mamba-style) linear attention: a conv state and a temporal state per layer."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    layers: int
    full_every: int
    """Layer ``i`` is full attention when ``i % full_every == full_every - 1`` (1: every layer)."""
    kv: PagedDims
    kv_layout: Literal["mha", "mla"] = "mha"
    mamba: GDNDims | None = None
    """Mamba/GDN slots on the non-full layers."""
    paged: tuple[PagedState, ...] = ()

    @property
    def pattern_layers(self) -> int:
        """The fewest first layers that hold one layer of each kind (the smallest model a demo runs)."""
        return self.full_every

    def schema(
        self,
        *,
        tp_size: int = 1,
        tp_rank: int = 0,
        page_size: int = 64,
        pool_pages: int = 1024,
        max_requests: int = 64,
        layers: int | None = None,
        dtype: str | None = None,
    ) -> RoleSchema:
        """The schema one rank of this model holds; ``layers``: only the model's first ``layers``
        layers (None: all of them), each at its real size."""
        p = replace(self, kv=replace(self.kv, dtype=dtype)) if dtype else self
        n = p.layers if layers is None else layers
        if n <= 0 or page_size <= 0 or pool_pages <= 0 or max_requests <= 0:
            raise SchemaError(f"profile {p.name!r}: layers, page_size, pool_pages, max_requests must be > 0")
        if n > p.layers:
            raise SchemaError(f"profile {p.name!r} has {p.layers} layers, not {n}: ask for at most that")
        full = [i for i in range(n) if i % p.full_every == p.full_every - 1]
        hybrid = [i for i in range(n) if i % p.full_every != p.full_every - 1]
        per_layer = 2 if p.kv_layout == "mha" else 1
        kv = KVSpec(
            item_len=page_size * p.kv.token_bytes(tp_size),
            num_pages=pool_pages,
            layer_ids=tuple(full) * per_layer,
            page_size=page_size,
            dtype=p.kv.dtype,
            layout=p.kv_layout,
        )
        comps = [_mamba(p.mamba, hybrid, tp_size, max_requests, p.name)] if p.mamba and hybrid else []
        for ps in p.paged:
            ids = full if ps.layers == "full" else hybrid
            if ids:
                comps.append(_paged(ps, ids, tp_size, page_size, pool_pages))
        return RoleSchema(p.name, tp_size, tp_rank, kv, tuple(comps), AuxSpec((64,), max_requests))


def _paged(ps: PagedState, ids: list[int], tp: int, page: int, pages: int) -> Component:
    item = page * ps.dims.token_bytes(tp)
    tensors = tuple(TensorSpec(item, layer_id=i) for i in ids for _ in range(ps.tensors_per_layer))
    return Component(ps.name, ps.state_type, tensors, pages, ps.dims.dtype)


def _mamba(g: GDNDims, ids: list[int], tp: int, slots: int, name: str) -> Component:
    if g.key_heads % tp or g.value_heads % tp:
        raise SchemaError(
            f"profile {name!r}: TP {tp} does not divide {g.key_heads} key / {g.value_heads} value heads"
        )
    kd, vd = g.key_dim, g.value_dim
    groups = (g.key_heads * kd, g.key_heads * kd, g.value_heads * vd)
    conv_rows, heads = sum(groups) // tp, g.value_heads // tp
    tensors = tuple(
        spec
        for i in ids
        for spec in (
            TensorSpec(conv_rows * (g.conv_kernel - 1) * 2, i, tp_dim=conv_rows, conv_shard_groups=groups),
            TensorSpec(heads * kd * vd * 4, i, tp_dim=heads),
        )
    )
    return Component("mamba", "mamba", tensors, slots, "float32")


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "qwen3-next",
            "Qwen3-Next-80B-A3B: 48 layers, every 4th full attention, the rest Gated DeltaNet",
            layers=48,
            full_every=4,
            kv=PagedDims(2, 256),
            mamba=GDNDims(16, 32, 128, 128, 4),
        ),
        Profile(
            "deepseek-v3.2",
            "DeepSeek-V3.2: MLA KV (512+64 latent, not split by TP) and DSA index keys",
            layers=61,
            full_every=1,
            kv=PagedDims(1, 576, split=False),
            kv_layout="mla",
            paged=(PagedState("dsa", "dsa", PagedDims(1, 128, "uint8", split=False, extra_bytes=4)),),
        ),
        Profile(
            "gpt-oss",
            "gpt-oss-120b: 36 layers alternating sliding-window (128) and full attention",
            layers=36,
            full_every=2,
            kv=PagedDims(8, 64),
            paged=(PagedState("swa", "swa", PagedDims(8, 64), layers="hybrid", tensors_per_layer=2),),
        ),
        Profile(
            "pure-kv",
            "Llama-3-8B-like dense model: KV only",
            layers=32,
            full_every=1,
            kv=PagedDims(8, 128),
        ),
        Profile(
            "minimax-m2",
            "MiniMax-like sparse attention: KV plus a positional dense-KV block per layer",
            layers=62,
            full_every=1,
            kv=PagedDims(8, 128),
            paged=(PagedState("dense_kv", "minimax_dense_kv", PagedDims(8, 128)),),
        ),
    )
}


def profile_names() -> tuple[str, ...]:
    return tuple(sorted(PROFILES))


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise SchemaError(
            f"unknown model profile {name!r}; known profiles: {', '.join(profile_names())}"
        ) from None


def schema_from_config(cfg: AgentConfig) -> RoleSchema:
    """This rank's schema: the named profile, or the explicit KV + components of ``model``."""
    m = cfg.model
    if m.profile is not None:
        p = profile(m.profile)
        if m.layers > p.layers:
            raise SchemaError(
                f"model.layers {m.layers}: profile {p.name!r} has {p.layers} layers; "
                f"set at most {p.layers} (0: all of them)"
            )
        return p.schema(
            tp_size=cfg.tp_size,
            tp_rank=cfg.tp_rank,
            page_size=m.page_size,
            pool_pages=m.pool_pages,
            max_requests=m.max_requests,
            layers=m.layers or None,
            dtype=m.dtype,
        )
    if m.kv_item_len is None or m.kv_item_len <= 0:
        raise SchemaError("model.kvItemLen must be a positive byte count when model.profile is null")
    if m.kv_layers <= 0:
        raise SchemaError("model.kvLayers must be positive when model.profile is null")
    try:
        kv = KVSpec(m.kv_item_len, m.pool_pages, tuple(range(m.kv_layers)) * 2, m.page_size, m.dtype)
        comps = tuple(_explicit(i, c) for i, c in enumerate(m.components))
        return RoleSchema(m.name, cfg.tp_size, cfg.tp_rank, kv, comps, AuxSpec((64,), m.max_requests))
    except SchemaError as exc:
        raise type(exc)(f"model: {exc}") from None


def _explicit(i: int, c: ComponentConfig) -> Component:
    where = f"components[{i}] ({c.name!r})"
    if not c.item_lens:
        raise SchemaError(f"{where}: itemLens is empty")
    for field, values in (("tpDims", c.tp_dims), ("layerIds", c.layer_ids)):
        if values and len(values) != len(c.item_lens):
            raise SchemaError(f"{where}: {field} has {len(values)} entries for {len(c.item_lens)} itemLens")
    dims = c.tp_dims or [0] * len(c.item_lens)
    ids = c.layer_ids or list(range(len(c.item_lens)))
    try:
        tensors = tuple(
            TensorSpec(n, lid, tp_dim=d) for n, lid, d in zip(c.item_lens, ids, dims, strict=True)
        )
        return Component(c.name, c.state_type, tensors, c.num_items, c.dtype)
    except SchemaError as exc:
        raise type(exc)(f"{where}: {exc}") from None
