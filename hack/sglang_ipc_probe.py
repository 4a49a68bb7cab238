"""Which CUDA tensors of sglang's pools export a CUDA IPC handle (``dataplane.transports.ipc_memory``):
builds each family's pools as ``tests/integration/sglang_rank.build_pools`` does, on the GPU, with sglang
loaded as ``PDPAIR_SGLANG_CPU_KERNELS=1`` loads it, and prints ok/refused counts per family.

On the H200 device, with the site of ``hack/sglang-device-site.sh``:
``PYTHONPATH=$PWD/site:$PWD:$PWD/operator python3 hack/sglang_ipc_probe.py``
"""

from __future__ import annotations

import torch

torch.version.cuda = None  # sglang loads without sgl_kernel (tests/integration/test_sglang_backend_gpu.py)

import sglang.srt.disaggregation.base.conn  # noqa: E402, F401

from dataplane.sglang.memory import tensors_of  # noqa: E402
from dataplane.transports.ipc_memory import export_ipc  # noqa: E402
from tests.integration.sglang_rank import FAMILIES, build_pools  # noqa: E402

for name, family in FAMILIES.items():
    pool, req = build_pools(family, 1, "cuda")
    ok = refused = 0
    for t in tensors_of(pool) + (tensors_of(req) if req is not None else []):
        if t.device.type != "cuda" or not t.numel():
            continue
        try:
            export_ipc(t.data_ptr(), t.device.index or 0)
            ok += 1
        except Exception as exc:  # a probe: every refusal is reported, none stops it
            refused += 1
            print(f"{name}: {tuple(t.shape)} {t.dtype}: {exc}")
    print(f"{name}: {ok} exported, {refused} refused")
