"""``pdpair-agent demo``'s argument checks, before any agent starts."""

from __future__ import annotations

import pytest

from dataplane.cli import main


def test_demo_refuses_cuda_ipc_without_gpu_pools(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--backend", "cuda-ipc"]) == 2
    assert "--backend cuda-ipc moves GPU memory: add --device cuda" in capsys.readouterr().err
