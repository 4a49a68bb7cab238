"""The CRD as a document: structural, described, defaults that agree with the operator's typed view,
and examples that parse. (That the API server accepts it is tests/e2e's job.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pdpair_operator.spec import PROFILES, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "pdpair.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, child in (node.get("properties") or {}).items():
        out += walk(child, f"{path}.{name}")
    if "items" in node:
        out += walk(node["items"], f"{path}[]")
    return out


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """The API server's defaulting, enough for this schema: object defaults, then field defaults."""
    if node.get("type") == "object" and isinstance(value, dict):
        for name, child in (node.get("properties") or {}).items():
            if name not in value and "default" in child:
                value[name] = child["default"]
            if name in value:
                value[name] = apply_defaults(child, value[name])
    if node.get("type") == "array" and isinstance(value, list) and "items" in node:
        value = [apply_defaults(node["items"], v) for v in value]
    return value


def test_every_field_is_typed_and_described() -> None:
    for path, node in walk(SCHEMA):
        if path in ("", ".metadata"):
            continue
        assert "type" in node, f"{path} has no type"
        if path.endswith("[]") and node["type"] != "object":
            continue  # scalar list items: the list's description covers them
        assert node.get("description"), f"{path} has no description"
        assert "type" in node, f"{path} has no type"


def test_names_columns_and_status_subresource() -> None:
    assert CRD["metadata"]["name"] == "pdpairs.pdpair.io"
    assert CRD["spec"]["names"]["shortNames"] == ["pdp"]
    assert VERSION["name"] == "v1alpha1" and VERSION["subresources"] == {"status": {}}
    columns = [c["name"] for c in VERSION["additionalPrinterColumns"]]
    assert columns[:4] == ["P Ready", "D Ready", "Ready", "Reason"] and columns[-1] == "Age"


def test_profile_enum_matches_the_operator() -> None:
    enum = SCHEMA["properties"]["spec"]["properties"]["model"]["properties"]["profile"]["enum"]
    assert tuple(enum) == PROFILES


def test_operator_profiles_are_the_agents_profiles() -> None:
    from dataplane.schema.profiles import profile_names

    assert set(PROFILES) == set(profile_names())


def test_crd_defaults_agree_with_the_typed_spec() -> None:
    minimal = {"model": {"name": "m", "profile": "pure-kv"}, "image": "i",
               "transfer": {"mori": {}, "nixl": {}},
               "prefill": {"resources": {"rdma": {}}}, "decode": {"resources": {"rdma": {}}}}
    defaulted = apply_defaults(SCHEMA["properties"]["spec"], yaml.safe_load(yaml.safe_dump(minimal)))
    assert parse_spec(defaulted) == parse_spec(minimal)


def test_cel_rules_carry_messages() -> None:
    rules = [r for _, node in walk(SCHEMA) for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 8
    assert all(r.get("message") for r in rules)
    assert any("oldSelf" in r["rule"] for r in rules), "immutable fields are marked"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_are_single_valid_pdpairs(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1
    doc = docs[0]
    assert (doc["apiVersion"], doc["kind"]) == ("pdpair.io/v1alpha1", "PDPair")
    assert len(doc["metadata"]["name"]) <= 40
    spec = parse_spec(apply_defaults(SCHEMA["properties"]["spec"], doc["spec"]))
    assert spec.model.profile in PROFILES or spec.layout_from_engine
    assert spec.prefill.tensor_parallel_size in (1, 2, 4, 8, 16, 32, 64)


def test_one_example_per_profile_and_serving_examples_name_no_layout() -> None:
    """Profiles are the synthetic engine's layouts; an example with a serving engine takes the layout
    its engine registers, so it names neither a profile nor components."""
    specs = [yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES]
    assert {s["model"]["profile"] for s in specs if "profile" in s["model"]} == set(PROFILES)
    serving = [s for s in specs if "sglang" in s.get("engine", {})]
    assert serving and all(set(s["model"]) == {"name"} for s in serving)
