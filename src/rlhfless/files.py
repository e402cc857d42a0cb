"""Writing a file so that a reader never sees half of it: run files, reports, simulator outputs.

The text or bytes go to a temporary file beside the target, which then replaces it in one
`os.replace`: a run killed mid-write leaves the old file or none, never a torn one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path`, creating its folder, all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
