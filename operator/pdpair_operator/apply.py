"""The executor: carries out a ``Plan`` against the API server. No decisions here.

It speaks raw JSON through the ``kubernetes`` client's ``ApiClient`` (its kubeconfig / in-cluster auth,
TLS and connection pool) instead of the typed ``CoreV1Api`` methods: those validate every body into
pydantic models and back, which costs more CPU than the request itself at hundreds of PDPairs.

Each step (status, creates, patches, deletes, events) runs even when an earlier one failed; errors are
collected and returned, so one bad child never hides the rest. Benign answers are not errors: 409 on
create (already there: a replayed plan), 404 on delete (already gone), 409 on a delete whose UID
precondition no longer matches (the slot already holds a replacement).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from .observe import Owner
from .planner import Delete, Event, Patch, Plan, rfc3339
from .spec import API_VERSION, GROUP, KIND, PLURAL, VERSION

log = logging.getLogger(__name__)
MERGE_PATCH = "application/merge-patch+json"
PATHS = {"Pod": "/api/v1/namespaces/{ns}/pods", "Service": "/api/v1/namespaces/{ns}/services",
         "ConfigMap": "/api/v1/namespaces/{ns}/configmaps", "Event": "/api/v1/namespaces/{ns}/events",
         "Secret": "/api/v1/namespaces/{ns}/secrets",
         "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
         "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
         "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
         "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"}
REQUEST_TIMEOUT_SECONDS = 30.0


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class StepError:
    step: str
    target: str
    message: str


def load_api_client(pool_size: int = 32, retries: int | None = None) -> k8s.ApiClient:
    """An ApiClient for the current kubeconfig, or the in-cluster service account; ``retries``:
    urllib3's per-request retries (None: its default)."""
    configuration = k8s.Configuration()
    configuration.retries = retries
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return k8s.ApiClient(configuration)


class Kube:
    """Blocking JSON requests with the client's auth; callers run them in threads."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self.api = api_client

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                query: list[tuple[str, str]] | None = None) -> Any:
        params = self.api.param_serialize(
            method=method, resource_path=path, query_params=query,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"])
        resp = self.api.call_api(*params, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        data = resp.read() or b""
        if not 200 <= resp.status <= 299:
            try:
                message = json.loads(data).get("message", "")
            except ValueError:
                message = data[:200].decode(errors="replace")
            raise KubeError(resp.status, message or str(resp.reason))
        return json.loads(data) if data else None


def object_path(namespace: str, kind: str, name: str | None = None) -> str:
    base = PATHS[kind].format(ns=namespace)
    return f"{base}/{name}" if name else base


def status_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"


class Executor:
    """Runs plans; ``concurrency`` bounds requests in flight across all PDPairs."""

    def __init__(self, kube: Kube, concurrency: int = 24, component: str = "pdpair-operator") -> None:
        self.kube = kube
        self.limit = asyncio.Semaphore(concurrency)
        self.threads = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="pdpair-api")
        """Own pool: asyncio's default one has cpu+4 threads, which would cap requests in flight."""
        self.component = component

    async def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                    query: list[tuple[str, str]] | None = None) -> Any:
        async with self.limit:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self.threads, self.kube.request, method, path, body, content_type, query)

    async def apply(self, owner: Owner, plan: Plan, now_iso: str) -> list[StepError]:
        """Status first (it records failures before their pods go), then children, then Events.
        Creates and deletes run in the plan's waves; a wave that failed stops the ones after it (the
        next reconcile retries them)."""
        errors: list[StepError] = []
        if plan.status is not None:
            await self._step(errors, "status", [(owner.name, lambda: self._call(
                "PATCH", status_path(owner.namespace, owner.name), {"status": plan.status}, MERGE_PATCH))])
        for wave in plan.create_waves():
            creates = [(f"{m['kind']}/{m['metadata']['name']}", self._creator(owner, m)) for m in wave]
            if not await self._step(errors, "create", creates):
                break
        patches = [(f"{p.kind}/{p.name}", self._patcher(owner, p)) for p in plan.patches]
        await self._step(errors, "patch", patches)
        for doomed in plan.delete_waves():
            deletes = [(f"{d.kind}/{d.name}", self._deleter(owner, d)) for d in doomed]
            if not await self._step(errors, "delete", deletes):
                break
        await self._step(errors, "event", [(e.reason, self._eventer(owner, e, now_iso)) for e in plan.events])
        return errors

    async def _step(self, errors: list[StepError], step: str,
                    calls: Iterable[tuple[str, Callable[[], Awaitable[Any]]]]) -> bool:
        """Run ``calls`` together; False if any failed (recorded in ``errors``)."""
        calls = list(calls)
        results = await asyncio.gather(*(fn() for _, fn in calls), return_exceptions=True)
        ok = True
        for (target, _), result in zip(calls, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(StepError(step, target, str(result)))
                ok = False
        return ok

    def _creator(self, owner: Owner, manifest: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
        async def create() -> None:
            try:
                await self._call("POST", object_path(owner.namespace, manifest["kind"]), manifest)
            except KubeError as exc:
                if (exc.status == 404 and manifest["kind"] == "ResourceClaimTemplate"
                        and "page not found" in str(exc)):
                    raise KubeError(404, f"the API server does not serve {manifest['apiVersion']} "
                                    f"{manifest['kind']}s: gpuAllocation 'dra' needs resource.k8s.io/v1 "
                                    "(Kubernetes 1.34 or later)") from exc
                if exc.status != 409:
                    raise
        return create

    def _patcher(self, owner: Owner, patch: Patch) -> Callable[[], Awaitable[Any]]:
        async def apply_patch() -> None:
            path = object_path(owner.namespace, patch.kind, patch.name)
            await self._call("PATCH", path, patch.body, MERGE_PATCH)
        return apply_patch

    def _deleter(self, owner: Owner, delete: Delete) -> Callable[[], Awaitable[Any]]:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions",
                                "propagationPolicy": "Background"}
        if delete.uid:
            body["preconditions"] = {"uid": delete.uid}

        async def remove() -> None:
            try:
                await self._call("DELETE", object_path(owner.namespace, delete.kind, delete.name), body)
            except KubeError as exc:
                if exc.status not in (404, 409):
                    raise
        return remove

    def _eventer(self, owner: Owner, event: Event, now_iso: str) -> Callable[[], Awaitable[Any]]:
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name,
                               "namespace": owner.namespace, "uid": owner.uid},
            "type": event.type, "reason": event.reason, "message": event.message[:1024],
            "firstTimestamp": now_iso, "lastTimestamp": now_iso, "count": 1,
            "source": {"component": self.component}, "reportingComponent": self.component,
            "reportingInstance": self.component,
        }

        async def post() -> None:
            await self._call("POST", object_path(owner.namespace, "Event"), body)
        return post


__all__ = ["Executor", "Kube", "KubeError", "StepError", "load_api_client", "rfc3339"]
