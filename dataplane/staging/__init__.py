"""The staged transfer path: small pages gathered into one registered buffer, one write, a scatter.

Between the planner and the transports in spirit: ``paths`` decides per component (or request)
between direct engine writes and staging, from the plan's write sizes; ``rows`` turns a plan's byte
ranges into row runs of a chunked arena view; ``pool`` bounds and reuses staging slots with
back-pressure; ``notice`` is the wire of the staged path; ``flow`` drives it without blocking; and
``gpu`` / ``host`` are the gather / scatter on CUDA (torch, imported lazily: importing this package
needs no torch) and in host memory.
See docs/gpu.md for the measurements behind the default threshold.
"""

from .flow import Piece, StagedReceiver, StagedSender, pieces_of
from .host import HostStager
from .notice import StagedAck, StagedNotice, decode_staged, encode_staged
from .paths import DEFAULT_THRESHOLD, Path, PathChoice, choose_paths
from .pool import SlotPool
from .rows import Runs, expand, pick_chunk, region_rows, runs_of, split

__all__ = [
    "DEFAULT_THRESHOLD",
    "HostStager",
    "Path",
    "PathChoice",
    "Piece",
    "Runs",
    "SlotPool",
    "StagedAck",
    "StagedNotice",
    "StagedReceiver",
    "StagedSender",
    "choose_paths",
    "decode_staged",
    "encode_staged",
    "expand",
    "pick_chunk",
    "pieces_of",
    "region_rows",
    "runs_of",
    "split",
]
