"""A PDPair that serves: ``engine.sglang`` renders sglang's own command with PDPair's transfer backend,
and a PD router (sglang-router, whose own argument parser reads the rendered arguments here) that finds
the current generation's prefill and decode pods through the API server."""

from __future__ import annotations

import argparse
import itertools

import pytest
from operator_world import World, make_owner
from pdpair_operator import naming, render, serving
from pdpair_operator.planner import Delete
from pdpair_operator.spec import generation_hash
from pdpair_operator.validate import invalid_reason

IMAGE = "registry.example/pdpair-sglang:0.5.23"


def sglang_spec(**router):
    extra = {"engine": {"image": IMAGE, "sglang": {"modelPath": "Qwen/Qwen3-Next-80B-A3B-Instruct",
                                                   "args": ["--mem-fraction-static", "0.8"]}},
             "prefill": {"replicas": 1, "tensorParallelSize": 2}, "decode": {"replicas": 2}}
    if router:
        extra["router"] = router
    return extra


def engine_of(pod):
    return next(c for c in pod["spec"]["containers"] if c["name"] == "engine")


def test_sglang_engine_runs_launch_server_with_the_pdpair_backend_and_the_role_sizes():
    owner = make_owner(**sglang_spec())
    gen = generation_hash(owner.spec)
    prefill, decode = (render.build_pod(owner, gen, role, 0) for role in ("prefill", "decode"))
    eng = engine_of(prefill)
    assert eng["image"] == IMAGE and eng["command"] == ["python3", "-m", "sglang.launch_server"]
    args = eng["args"]
    pairs = dict(itertools.pairwise(args))
    assert pairs["--disaggregation-transfer-backend"] == "pdpair"
    assert pairs["--disaggregation-mode"] == "prefill" and pairs["--tp-size"] == "2"
    assert pairs["--disaggregation-bootstrap-port"] == str(owner.spec.ports.bootstrap)
    assert args[-2:] == ["--mem-fraction-static", "0.8"]
    assert prefill["metadata"]["annotations"][serving.BOOTSTRAP_PORT_ANNOTATION] == "8998"
    d_args = engine_of(decode)["args"]
    assert d_args[d_args.index("--disaggregation-mode") + 1] == "decode"
    assert "--disaggregation-bootstrap-port" not in d_args and d_args[d_args.index("--tp-size") + 1] == "1"
    assert serving.BOOTSTRAP_PORT_ANNOTATION not in decode["metadata"]["annotations"]
    # Probes mean "serving": sglang's /health on the engine's port; loading gets the startup budget.
    assert eng["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert eng["startupProbe"]["failureThreshold"] * eng["startupProbe"]["periodSeconds"] >= 1800
    assert {"name": "http", "containerPort": 30000, "protocol": "TCP"} in eng["ports"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in eng["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in prefill["spec"]["volumes"]
    # Everything sglang writes is a volume, so its root filesystem can be read-only.
    env = {e["name"]: e["value"] for e in eng["env"]}
    assert env["HF_HOME"].startswith(serving.CACHE_DIR) and env["HOME"] == serving.CACHE_DIR
    assert {"name": "engine-cache", "mountPath": serving.CACHE_DIR} in eng["volumeMounts"]
    assert eng["securityContext"]["readOnlyRootFilesystem"] is True
    assert eng["securityContext"]["runAsNonRoot"] is True
    # The agent beside it serves the engine over the local API.
    cfg = render.agent_config_for(owner, gen, "prefill")
    assert cfg.localapi.engine.mode == "external"


def parse_router(args):
    """sglang-router's own parser (``sglang_router.router_args``): a flag it does not know fails here."""
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return RouterArgs.from_cli_args(parser.parse_args(args), use_router_prefix=False)


def test_router_finds_exactly_the_current_generations_engines_by_discovery():
    owner = make_owner(**sglang_spec(policy="power_of_two", args=["--request-timeout-secs", "600"]))
    gen = generation_hash(owner.spec)
    children = render.build_router_children(owner, gen, network_policy=True)
    kinds = {c["kind"]: c for c in children}
    assert set(kinds) == {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "NetworkPolicy",
                          "PodDisruptionBudget"}
    assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == serving.router_labels("demo")
    deployment = kinds["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE  # the engine's image carries sglang-router
    parsed = parse_router(container["args"])
    assert parsed.pd_disaggregation and parsed.service_discovery
    assert parsed.service_discovery_namespace == "ns" and parsed.service_discovery_port == 30000
    assert parsed.prefill_selector == naming.pod_selector("demo", "prefill", gen)
    assert parsed.decode_selector == naming.pod_selector("demo", "decode", gen)
    assert parsed.policy == "power_of_two" and parsed.request_timeout_secs == 600
    assert parsed.port == 8000 and parsed.bootstrap_port_annotation == serving.BOOTSTRAP_PORT_ANNOTATION
    # The selectors match the rendered engine pods' labels and nothing of another role or generation.
    prefill = render.build_pod(owner, gen, "prefill", 0)["metadata"]["labels"]
    assert parsed.prefill_selector.items() <= prefill.items()
    assert not parsed.decode_selector.items() <= prefill.items()
    # Least privilege: the router's account may read pods, nothing else.
    assert kinds["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                       "verbs": ["get", "list", "watch"]}]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == kinds["ServiceAccount"][
        "metadata"]["name"] == kinds["RoleBinding"]["subjects"][0]["name"]
    # Router pods are not children the operator's pod index would take for engines.
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert naming.MANAGED_BY not in template_labels and naming.LABEL_NAME not in template_labels
    assert kinds["Service"]["spec"]["selector"].items() <= template_labels.items()
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == "owner-uid" for c in children)


def test_router_rejects_what_its_parser_does_not_know():
    """The check above is real: sglang-router's parser refuses an unknown flag."""
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parse_router(["--pd-disaggregation", "--bootstrap-port-annotation", "x"])


def test_network_policy_admits_the_router_to_the_engine_port_only():
    owner = make_owner(**sglang_spec())
    policy = render.build_network_policy(owner, {"namespaceSelector": {}})
    rule = policy["spec"]["ingress"][-1]
    assert rule == {"from": [{"podSelector": {"matchLabels": serving.router_labels("demo")}}],
                    "ports": [{"protocol": "TCP", "port": 30000}]}
    plain = render.build_network_policy(make_owner(), {"namespaceSelector": {}})
    assert len(plain["spec"]["ingress"]) == 2


def test_planner_creates_the_router_follows_rollouts_and_removes_it_with_the_engine():
    world = World(make_owner(**sglang_spec()))
    gen = generation_hash(world.owner.spec)
    first = world.step()
    router = naming.router("demo")
    made = {(c["kind"], c["metadata"]["name"]) for c in first.creates}
    assert {("Deployment", router), ("Service", router), ("Role", router), ("RoleBinding", router),
            ("ServiceAccount", router), ("NetworkPolicy", naming.router_network_policy("demo"))} <= made
    assert first.status is not None and first.status["router"] == "http://demo-router.ns.svc:8000"
    world.run()
    assert world.step().creates == ()
    # A new generation: the router is patched to the new generation's selectors (no new objects).
    world.spec_change(**{**sglang_spec(), "image": "img:2"})
    gen2 = generation_hash(world.owner.spec)
    assert gen2 != gen
    result = world.step()
    patched = {p.kind for p in result.patches if p.name == router}
    assert patched == {"Deployment"}
    args = world.manifests[("Deployment", router)]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert parse_router(args).prefill_selector[naming.LABEL_GENERATION] == gen2
    # Router settings alone start no rollout of the engine pods.
    world.spec_change(**{**sglang_spec(replicas=3), "image": "img:2"})
    assert generation_hash(world.owner.spec) == gen2
    # Without the engine the router goes away.
    world.spec_change(image="img:2")
    result = world.step()
    gone = {(d.kind, d.name) for d in result.deletes if isinstance(d, Delete) and d.kind != "Pod"}
    assert ("Deployment", router) in gone and ("Role", router) in gone and ("Service", router) in gone
    assert "router" not in (result.status or world.owner.status)


def test_router_disabled_renders_none_and_sglang_without_image_is_invalid():
    owner = make_owner(**sglang_spec(enabled=False))
    assert render.build_router_children(owner, generation_hash(owner.spec), network_policy=True) == []
    bad = make_owner(engine={"sglang": {"modelPath": "m"}})
    reason = invalid_reason(bad, generation_hash(bad.spec))
    assert reason is not None and reason[0] == "EngineImageMissing" and "engine.image" in reason[1]
    many = make_owner(p=3, engine={"image": IMAGE, "sglang": {"modelPath": "m"}})
    assert invalid_reason(many, generation_hash(many.spec)) is None, "decode pairs with the router's prefill"
    both = make_owner(engine={"image": IMAGE, "args": ["--x"], "sglang": {"modelPath": "m"}})
    reason = invalid_reason(both, generation_hash(both.spec))
    assert reason is not None and "engine.sglang.args" in reason[1]
