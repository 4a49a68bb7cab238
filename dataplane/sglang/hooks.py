"""How the plugin enters sglang: hooks registered through sglang's own plugin framework, no fork.

``register`` is the entry point of group ``sglang.srt.plugins``; sglang's ``load_plugins()`` calls it in
every process (launcher, scheduler, DP controller, detokenizer) and then applies the hooks:

- ``pdpair`` joins ``--disaggregation-transfer-backend``'s choices (``add_disagg_transfer_backend_choices``);
- ``disaggregation.utils.TransferBackend`` is replaced by the same Enum plus ``PDPAIR`` (sglang builds it
  from the argument in the scheduler, the tokenizer mixin and ``disagg_service``; the hook registry
  re-binds every module's imported name);
- ``get_kv_class`` answers ``PDPAIR`` with this package's classes and passes any other backend on;
- after ``MetadataBuffers.__init__`` with the pdpair backend, its tensors move where the agent can
  reach them: a memfd arena on a CPU engine, one device allocation beside the KV pools on a GPU
  engine (sglang's own CUDA placement of these buffers, as with a custom memory pool).
"""

from __future__ import annotations

import enum
import logging
from typing import Any

log = logging.getLogger(__name__)
BACKEND = "pdpair"
UTILS = "sglang.srt.disaggregation.utils"


def register() -> None:
    """The ``sglang.srt.plugins`` entry point."""
    from sglang.srt.arg_groups.choices import (
        DISAGG_TRANSFER_BACKEND_CHOICES,
        add_disagg_transfer_backend_choices,
    )
    from sglang.srt.disaggregation import utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        add_disagg_transfer_backend_choices([BACKEND])
    if "PDPAIR" not in utils.TransferBackend.__members__:
        HookRegistry.register(f"{UTILS}.TransferBackend", extended_backend_enum(utils.TransferBackend),
                              HookType.REPLACE)
    HookRegistry.register(f"{UTILS}.get_kv_class", get_kv_class, HookType.AROUND)
    HookRegistry.register(f"{UTILS}.MetadataBuffers.__init__", place_metadata_buffers, HookType.AFTER)


def extended_backend_enum(original: type[enum.Enum]) -> type[enum.Enum]:
    """sglang's ``TransferBackend`` with ``PDPAIR`` added (an Enum cannot gain members in place)."""
    members = {m.name: m.value for m in original} | {"PDPAIR": BACKEND}
    extended = enum.Enum(original.__name__, members, module=original.__module__)  # type: ignore[misc]
    extended.__qualname__ = original.__qualname__
    return extended


def get_kv_class(original: Any, transfer_backend: Any, class_type: Any) -> Any:
    """``get_kv_class``'s AROUND hook: the pdpair classes for ``PDPAIR``, sglang's for the rest."""
    if getattr(transfer_backend, "value", transfer_backend) != BACKEND:
        return original(transfer_backend, class_type)
    from sglang.srt.disaggregation.base.conn import KVArgs

    from . import conn

    classes = {
        "kvargs": KVArgs,
        "manager": conn.PDPairKVManager,
        "sender": conn.PDPairKVSender,
        "receiver": conn.PDPairKVReceiver,
        "bootstrap_server": conn.PDPairKVBootstrapServer,
    }
    return classes[class_type.value]


def place_metadata_buffers(result: Any, buffers: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``MetadataBuffers.__init__``: with the pdpair backend, its CPU tensors move to memory the
    agent can map (other backends are left alone)."""
    if not _pdpair_selected():
        return
    import torch

    from .memory import relocate

    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        for name, value in list(vars(buffers).items()):
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                setattr(buffers, name, value.to(device))
        return
    relocate(buffers)


def _pdpair_selected() -> bool:
    try:
        from sglang.srt.runtime_context import get_disagg

        return str(get_disagg().disaggregation_transfer_backend) == BACKEND
    except Exception:  # no published server args in this process (a tool, a test): decide by the caller
        return _FORCED
_FORCED = False


def force_host_arenas(on: bool = True) -> None:
    """For a process without published server args (the tests' harness): treat pdpair as selected."""
    global _FORCED
    _FORCED = on
