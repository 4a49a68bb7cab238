"""A tiny in-memory API server + kubelet for the operator's unit tables: applies plans to a dict of
pods and children, so multi-step rollouts can be driven through the pure planner without a cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from pdpair_operator import naming
from pdpair_operator.observe import ChildView, Owner, PodCondition, PodView, child_from_body, pod_from_body
from pdpair_operator.planner import Observed, Plan, plan
from pdpair_operator.spec import parse_spec

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def make_spec(p: int = 1, d: int = 1, image: str = "img:1", strategy: str = "Coordinated", surge: int = 1,
              backend: str = "nixl", **extra: Any) -> dict[str, Any]:
    spec = {
        "model": {"name": "m", "profile": "qwen3-next"},
        "image": image,
        "transfer": {"backend": backend},
        "prefill": {"replicas": p},
        "decode": {"replicas": d},
        "updateStrategy": {"type": strategy, "maxSurgeUnits": surge},
    }
    spec.update(extra)
    return spec


def make_owner(status: dict[str, Any] | None = None, name: str = "demo", generation: int = 1,
               **spec: Any) -> Owner:
    return Owner(name=name, namespace="ns", uid="owner-uid", generation=generation,
                 spec=parse_spec(make_spec(**spec)), status=status or {})


def serving(pod: PodView) -> PodView:
    return msgspec.structs.replace(pod, phase="Running", ready=True,
                                   transfer=PodCondition("True", "HandshakeComplete", "ok"))


@dataclass
class World:
    """Plays API server (create/delete by name, 409/404 semantics) and kubelet (``run``)."""

    owner: Owner
    now: datetime = T0
    pods: dict[str, PodView] = field(default_factory=dict)
    children: dict[tuple[str, str], ChildView] = field(default_factory=dict)
    manifests: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    history: list[Plan] = field(default_factory=list)
    uid_counter: int = 0

    def observed(self) -> Observed:
        return Observed(tuple(self.pods.values()), tuple(self.children.values()))

    def step(self, seconds: float = 1.0) -> Plan:
        self.now += timedelta(seconds=seconds)
        result = plan(self.owner, self.observed(), self.now)
        self.apply(result)
        return result

    def apply(self, result: Plan) -> None:
        self.history.append(result)
        if result.status is not None:
            self.owner = msgspec.structs.replace(self.owner, status=result.status)
        for m in result.creates:
            key = (m["kind"], m["metadata"]["name"])
            if key in self.manifests:
                continue  # 409 AlreadyExists
            self.uid_counter += 1
            body = {**m, "metadata": {**m["metadata"], "uid": f"uid-{self.uid_counter}"}}
            self.manifests[key] = body
            if m["kind"] == "Pod":
                self.pods[key[1]] = pod_from_body(body)
            else:
                self.children[key] = child_from_body(m["kind"], body)
        for p in result.patches:
            meta = p.body["metadata"]
            self.manifests[(p.kind, p.name)] = {"kind": p.kind, **p.body}
            self.children[(p.kind, p.name)] = child_from_body(p.kind, {"metadata": meta})
        for d in result.deletes:
            if d.kind == "Pod":
                pod = self.pods.get(d.name)
                if pod is not None and (not d.uid or d.uid == pod.uid):
                    del self.pods[d.name]
                    self.manifests.pop((d.kind, d.name), None)
            else:
                self.children.pop((d.kind, d.name), None)
                self.manifests.pop((d.kind, d.name), None)

    def run(self, *names: str) -> None:
        """kubelet + agents: the named pods (default: all) become Running, Ready and transfer-ready."""
        for name in names or tuple(self.pods):
            self.pods[name] = serving(self.pods[name])

    def spec_change(self, **spec: Any) -> None:
        self.owner = msgspec.structs.replace(
            self.owner, spec=parse_spec(make_spec(**spec)), generation=self.owner.generation + 1)

    def by_gen(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for p in self.pods.values():
            out.setdefault(p.generation, {"prefill": 0, "decode": 0})[p.role] += 1
        return out

    def decode_peer(self, generation: str) -> str:
        """The bootstrap host the decode agents of one generation are configured with."""
        cm = self.manifests[("ConfigMap", naming.config_map(self.owner.name, generation))]
        from dataplane.config import parse_config

        return parse_config(cm["data"]["decode.yaml"]).peer.bootstrap_host
