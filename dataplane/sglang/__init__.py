"""The ``pdpair`` transfer backend for sglang 0.5.23: sglang's prefill and decode hand their pools and
rooms to the pod's PDPair agent over the local API.

Installed with ``pip install 'pdpair[sglang]'``, which declares ``register`` as an entry point of
sglang's plugin group ``sglang.srt.plugins``; then ``--disaggregation-transfer-backend pdpair`` selects
it (docs/sglang.md). ``hooks`` enters sglang, ``layout`` reads ``KVArgs`` as a schema, ``memory``
shares the pools, ``support`` refuses what the backend cannot carry, ``conn`` holds sglang's classes.
Nothing else in ``dataplane`` imports this package (an import-linter contract); importing it does not
import sglang — ``conn`` does, when sglang asks for the classes.
"""

from .hooks import BACKEND, register

__all__ = ["BACKEND", "register"]
