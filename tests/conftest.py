"""Shared pytest fixtures.

``cluster`` (session): a real Kubernetes API server for tests marked
``@pytest.mark.cluster`` (devcluster: etcd, kube-apiserver, controller-manager,
scheduler, kwok on 127.0.0.1). With ``PDPAIR_TEST_KUBECONFIG=<path>``, or
``PDPAIR_USE_EXISTING_CLUSTER=1`` and ``KUBECONFIG``, the tests use that cluster
instead; otherwise one is started in a temporary directory (building missing
binaries first, see docs/devcluster.md) and stopped when the session ends.
Tests that do not ask for it never start it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults_support import FaultRow
from hypothesis import HealthCheck, settings

from devcluster import Cluster
from devcluster.cluster import ensure_binaries

# Agents the tests start run the interpreted modules unless the run asks otherwise: a compiled copy left
# in the cache by a benchmark must not change what a test run exercises. scripts/test runs the agents'
# integration tests a second time with PDPAIR_COMPILED=on (dataplane/compiled).
os.environ.setdefault("PDPAIR_COMPILED", "off")

# Property tests check what the code does, not how fast this machine draws inputs: on a shared 2-core
# host a draw can stall for seconds, which Hypothesis's timing checks would report as a failure.
settings.register_profile("pdpair", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pdpair")


def _existing_kubeconfig() -> Path | None:
    explicit = os.environ.get("PDPAIR_TEST_KUBECONFIG")
    if explicit:
        return Path(explicit)
    if os.environ.get("PDPAIR_USE_EXISTING_CLUSTER") == "1" and os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    return None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running cluster (ours, or the one PDPAIR_TEST_KUBECONFIG / KUBECONFIG points at)."""
    existing = _existing_kubeconfig()
    if existing is not None:
        handle = Cluster.existing(existing)
        handle.wait_ready(timeout=60)
        yield handle
        return
    local = Cluster(workdir=tmp_path_factory.mktemp("k8s"), binaries=ensure_binaries())
    local.start(timeout=180)
    try:
        yield local
    finally:
        local.stop(remove_data=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Each phase's report on the item (``fault_row`` reads the call's outcome)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def fault_row(request: pytest.FixtureRequest) -> Iterator[FaultRow]:
    """This test's row of the fault matrix: the test names the fault and fills what it observed; the
    outcome is the test's own (``tests/faults_support.py``)."""
    row = FaultRow(fault=request.node.name, injected="", bound="")
    yield row
    call = getattr(request.node, "report_call", None)
    if call is None:
        row.outcome = "not run"
    elif call.passed:
        row.outcome = "converged"
    else:
        lines = str(call.longrepr).strip().splitlines()
        last_error = next((ln for ln in lines if ln.startswith("E ")), lines[-1])
        row.outcome = "FAILED: " + last_error[1:].strip()[:160]
    row.write()
