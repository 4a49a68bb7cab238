"""The cases ``bench transfer`` and ``sidecar-bench`` measure: per block size a KV-only model whose page
is the block (each request = one page of K and one of V), a model profile's request mix, and that mix
between pods of different TP, each an
``AgentConfig`` for a loopback pair with verification off."""

from __future__ import annotations

from ...config import AgentConfig, ModelConfig, NixlConfig, RoleConfig, SyntheticConfig, TransferConfig


def cases(
    sizes: tuple[int, ...], mix: str, *, case_bytes: int, max_requests: int, mix_requests: int, inflight: int,
    nixl: NixlConfig | None = None,
) -> list[tuple[str, AgentConfig]]:
    """``(label, config)`` per block size (enough requests to move ``case_bytes``, at least 20, at most
    ``max_requests``) and, when ``mix`` names a profile, one mix case of ``mix_requests`` requests."""
    out = []
    for block in sizes:
        requests = max(20, min(max_requests, case_bytes // (2 * block)))
        out.append((label(block), block_config(block, requests, nixl, inflight)))
    if mix:
        out.append((f"mix:{mix}", mix_config(mix, min(max_requests, mix_requests), nixl, inflight)))
    return out


def label(size: int) -> str:
    return f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"


def _transfer(nixl: NixlConfig) -> TransferConfig:
    return TransferConfig(timeout_seconds=60, heartbeat_interval_seconds=0.5, nixl=nixl)


def block_config(block: int, requests: int, nixl: NixlConfig | None = None, inflight: int = 1) -> AgentConfig:
    pages = max(2 * inflight, min(16, (64 << 20) // block))
    return AgentConfig(
        model=ModelConfig(
            name=f"block-{block}", profile=None, kv_item_len=block, kv_layers=1, page_size=16,
            pool_pages=pages, max_requests=max(8, 2 * inflight), prefault=True,
        ),
        transfer=_transfer(nixl or NixlConfig()),
        synthetic=SyntheticConfig(
            requests_per_second=0, requests=requests, tokens=(16,), max_inflight=inflight, verify=False
        ),
    )


def mix_config(
    profile: str, requests: int, nixl: NixlConfig | None = None, inflight: int = 1, prefill_tp: int = 1,
    decode_tp: int = 1,
) -> AgentConfig:
    """The profile's request mix between a prefill pod of TP ``prefill_tp`` and a decode pod of TP
    ``decode_tp``. A rank of the wider pod finishes its part of a room on its own, so the narrower
    side holds parts of more rooms than one rank keeps in flight: its pools are sized for that skew."""
    skew = max(prefill_tp, decode_tp) // min(prefill_tp, decode_tp)
    return AgentConfig(
        model=ModelConfig(
            profile=profile, pool_pages=128 * max(4, inflight) * skew,
            max_requests=max(16, 2 * inflight) * skew, prefault=True,
        ),
        prefill=RoleConfig(tp_size=prefill_tp),
        decode=RoleConfig(tp_size=decode_tp),
        transfer=_transfer(nixl or NixlConfig()),
        synthetic=SyntheticConfig(
            requests_per_second=0, requests=requests, tokens=(1024, 4096, 300, 2048), max_inflight=inflight,
            verify=False,
        ),
    )
