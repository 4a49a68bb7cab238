"""NIXL (UCX): host memory and VRAM between processes and hosts, split by idea.

- ``adapter``: ``NixlTransport``, the ``Transport`` itself — registration, peers, the life of a write;
- ``descriptors``: how a batch (a compact plan's strided entries included) becomes NIXL requests over
  descriptor lists prepared once per side and block size;
- ``posting`` and ``native/``: the threads that post host writes off the role worker (the native one
  signals completion through an eventfd);
- ``sdk``: the one module that imports NIXL or binds to its library, and the UCX environment a
  process sets where it starts (``ucx_environment``).
"""

from .adapter import NixlPeer, NixlTransfer, NixlTransport
from .sdk import load_sdk, ucx_environment

__all__ = ["NixlPeer", "NixlTransfer", "NixlTransport", "load_sdk", "ucx_environment"]
