"""What the pdpair backend accepts of sglang's server arguments, checked once at start-up.

Each refusal is one line naming the argument and the fix, raised from the KV manager's constructor —
sglang's scheduler then fails to start instead of failing requests later. ``engine_topology`` is the
rank's place in the engine, by sglang's own rules (``runtime_context.derive_attn_tp_size`` /
``derive_attention_ranks``: attention TP is what is left of TP after attention DP and CP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import Unsupported


@dataclass(frozen=True)
class Topology:
    tp_rank: int
    tp_size: int
    dp_size: int
    """Attention DP size (sglang's ``attn_dp_size``; the older ``--dp-size --enable-dp-attention``)."""

    @property
    def attn_tp_size(self) -> int:
        return max(1, self.tp_size // self.dp_size)

    @property
    def attn_tp_rank(self) -> int:
        return self.tp_rank % self.attn_tp_size


def _int(server_args: Any, name: str, default: int = 1) -> int:
    value = getattr(server_args, name, None)
    return default if value is None else int(value)


def engine_topology(server_args: Any, tp_rank: int) -> Topology:
    dp = _int(server_args, "attn_dp_size")
    if dp <= 1 and getattr(server_args, "enable_dp_attention", False):
        dp = _int(server_args, "dp_size")
    return Topology(tp_rank, _int(server_args, "tp_size"), max(1, dp))


def check_server_args(server_args: Any, role: str) -> None:
    """Refuse, with one line, what the pdpair backend cannot carry."""
    refusals = [
        (_int(server_args, "pp_size") > 1, "--pp-size > 1 (pipeline parallelism)", "run with --pp-size 1"),
        (_int(server_args, "attn_cp_size") > 1, "--attn-cp-size > 1 (attention context parallelism)",
         "run with --attn-cp-size 1"),
        (_int(server_args, "dcp_size") > 1, "--dcp-size > 1 (decode context parallelism)",
         "run with --dcp-size 1"),
        (role == "prefill" and engine_topology(server_args, 0).dp_size > 1, "DP attention on prefill",
         "run prefill without DP attention (decode may use it)"),
        (bool(getattr(server_args, "enable_hisparse", False)), "--enable-hisparse", "run without it"),
        (bool(getattr(server_args, "enable_pd_role_switch", False)), "--enable-pd-role-switch",
         "run without it"),
    ]
    for refused, what, fix in refusals:
        if refused:
            raise Unsupported(f"pdpair: the pdpair transfer backend does not support {what}; {fix}")
    tp = _int(server_args, "tp_size")
    if tp & (tp - 1):
        raise Unsupported(f"pdpair: --tp-size {tp} is not a power of two; PDPair pairs power-of-two TP sizes")
