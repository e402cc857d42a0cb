"""Writing a file so that a reader never sees half of it: run files, reports, simulator outputs.

The text or bytes go to a temporary file beside the target, which then replaces it in one
`os.replace`: a run killed mid-write leaves the old file or none, never a torn one. What is
written so takes the mode a plain `open` or `mkdir` gives under the umask (`shareable`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    """This process's umask, read without setting it where Linux reports it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shareable(path: Path) -> Path:
    """`path` (a file, or a folder and the files in it) with the mode a plain `open` or `mkdir`
    gives under the umask. `mkstemp`, `mkdtemp` and safetensors make them owner-only, which hides
    a run, its report or an exported model from a team that reads them under another user
    (TensorBoard, a web server, vLLM)."""
    mask = _umask()
    if path.is_dir():
        for child in path.iterdir():
            if child.is_file():
                child.chmod(0o666 & ~mask)
        path.chmod(0o777 & ~mask)
    else:
        path.chmod(0o666 & ~mask)
    return path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path`, creating its folder, all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(shareable(Path(tmp)), path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
