"""PDPair operator: reconciles ``PDPair`` resources into prefill/decode pods, Services and agent config.

Layers: ``spec``/``naming``/``observe`` (data) → ``render`` and ``status`` (pure builders) → ``planner``
(pure plan) → ``apply`` (executor) → ``reconciler`` (work loop) → ``handlers`` (kopf glue) → ``cli``.
"""

from .planner import Delete, Event, Observed, Patch, Plan, plan
from .spec import API_VERSION, GROUP, KIND, PLURAL, VERSION, PDPairSpec, generation_hash, parse_spec

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION",
    "Delete", "Event", "Observed", "PDPairSpec", "Patch", "Plan",
    "generation_hash", "parse_spec", "plan",
]
