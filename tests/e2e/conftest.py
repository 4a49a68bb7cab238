"""Fixtures shared by the operator's end-to-end modules: one operator watching every namespace for the
whole module, and a fresh namespace per test, named after its module. A module that runs operators of
its own (``test_operator_faults.py``) defines ``operator`` and ``ns`` itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_support import install_crd, running_operator

from devcluster import Cluster


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    install_crd(cluster)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(cluster, log, "--all-namespaces") as proc:
        yield log
        assert proc.poll() is None, f"operator exited: {log.read_text()[-3000:]}"


@pytest.fixture
def ns(cluster: Cluster, operator: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    prefix = request.module.__name__.removeprefix("test_").replace("_", "-")[:20]
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
