"""The one way a user's file is opened: present, under a size limit, UTF-8, else one line naming it.

Every reader of a file the user hands us (config, data, prompts, profile, run directory) goes
through here, so a missing, huge or non-UTF-8 file fails the same way everywhere: an `InputError`
whose message starts with the path, which the commands print as one line with exit code 2.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MB = 1 << 20
# Files that are small by nature (configs, profiles, checkpoint metadata): refuse anything larger
# before reading it, so a wrong path to a huge file cannot exhaust memory.
SMALL_FILE_BYTES = 16 * MB


class InputError(ValueError):
    """A user's file that cannot be read as what it should be; the message names the file first."""


def check_file(path: Path, what: str, max_bytes: int = SMALL_FILE_BYTES) -> int:
    """The size of `path` in bytes, after checking it is a regular file no larger than `max_bytes`."""
    if not path.exists():
        raise InputError(f"{path}: not found, expected {what}")
    if not path.is_file():
        state = "is a directory" if path.is_dir() else "is not a regular file (a pipe or a device)"
        raise InputError(f"{path}: {state}, expected {what}")
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"{path}: {size / MB:.1f} MB, expected {what} of at most {max_bytes / MB:.0f} MB")
    return size


def _decode(path: Path, raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{path}: {where}byte {err.start} is not UTF-8 ({raw[err.start : err.start + 1]!r}), "
            "expected UTF-8 text"
        ) from None


def first_line(err: BaseException) -> str:
    """An exception's message to its first line (its type's name where it has none): what a
    library said, inside a refusal that is one line."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def check_writable(path: Path, what: str) -> None:
    """`path` (a file or folder to create) can be made by this user, checked without creating
    anything: its nearest existing ancestor is a directory this user may write. A command checks
    its outputs so before it loads or computes anything."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if here != Path(path).absolute() and not here.is_dir():
        raise InputError(f"{what}: {path}: {here} is a file, expected a directory to write in")
    folder = here if here.is_dir() else here.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what}: {path}: {folder} is not writable by this user")


def read_text(path: Path, what: str, max_bytes: int = SMALL_FILE_BYTES) -> str:
    """The whole file as text; empty (or blank) files are refused too."""
    check_file(path, what, max_bytes)
    text = _decode(path, path.read_bytes(), "")
    if not text.strip():
        raise InputError(f"{path}: empty, expected {what}")
    return text


def read_json_value(path: Path, what: str, max_bytes: int = SMALL_FILE_BYTES) -> Any:
    """The JSON value in `path`; truncated content is refused by name."""
    text = read_text(path, what, max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{path}: line {err.lineno}: invalid JSON ({err.msg}; truncated?), expected {what}"
        ) from None


def read_json(path: Path, what: str, max_bytes: int = SMALL_FILE_BYTES) -> dict[str, Any]:
    """A JSON object from `path`; truncated or non-object content is refused by name."""
    data = read_json_value(path, what, max_bytes)
    if not isinstance(data, dict):
        raise InputError(f"{path}: got a JSON {type(data).__name__}, expected {what} (a JSON object)")
    return data


def read_mapping(path: Path, what: str, max_bytes: int = SMALL_FILE_BYTES) -> dict[str, Any]:
    """A mapping from a YAML (or JSON, which YAML reads too) file; bad YAML or another shape is
    refused by name, with the line YAML stopped at."""
    import yaml

    text = read_text(path, what, max_bytes)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(f"{path}: {at}not valid YAML ({problem}), expected {what}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: got {type(data).__name__}, expected {what} (a mapping)")
    return data


def iter_lines(path: Path, what: str, max_bytes: int) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each non-blank line, streamed; the size is checked first."""
    check_file(path, what, max_bytes)
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = _decode(path, raw, f"line {number}: ")
            if line.strip():
                yield number, line
