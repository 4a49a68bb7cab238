"""``python -m dataplane.transports.nixl.native [FOLDER]``: build the native poster now (images, set-up)."""

import sys
from pathlib import Path

from . import build

print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
