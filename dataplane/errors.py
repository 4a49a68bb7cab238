"""The data plane's error tree. Each class carries retry meaning, so callers decide by type.

- ``BadInput``: bytes or indices from a peer or a user that violate the format or the schema.
  Never retry the same input; fail the room or refuse the peer with the message.
- ``IncompatiblePeer``: a peer whose schema cannot be paired with ours (refuse the handshake).
- ``TransferFailed``: an engine-level failure moving bytes (the room fails; the peer may recover).
- ``DeadlineExceeded``: a transfer or a peer did not answer in time (a ``TransferFailed``).
- ``PeerGone``: the peer died or was replaced (re-handshake before retrying).
"""

from __future__ import annotations


class PDPairError(Exception):
    """Root of every error the data plane raises on purpose."""


class BadInput(PDPairError, ValueError):
    """Malformed or out-of-range input; the message says exactly what and where."""


class WireFormatError(BadInput):
    """A frame or message that does not follow the wire format."""


class SchemaError(BadInput):
    """A schema, profile or component list that is inconsistent in itself."""


class PlanError(BadInput):
    """Indices or lengths that cannot be planned (out of range, overflowing a region, mismatched)."""


class UnknownStateType(SchemaError):
    """A state type nobody registered."""


class IncompatiblePeer(PDPairError):
    """The peer's schema manifest cannot be paired with ours; ``reason`` is human-readable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransferFailed(PDPairError):
    """The engine failed to move bytes."""


class DeadlineExceeded(TransferFailed, TimeoutError):
    """A transfer or a peer did not finish within its deadline."""


class PeerGone(TransferFailed):
    """The peer disconnected, died, or was replaced behind its address."""


class FrameTooLarge(WireFormatError):
    """A length-prefixed local-API frame that announces more bytes than the hard maximum."""


class LocalApiError(PDPairError):
    """The agent refused a local-API request; ``code`` is machine-readable, the message human-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class AgentUnavailable(PDPairError, ConnectionError):
    """The engine cannot reach its sidecar agent (not started, dead, or not answering in time)."""
