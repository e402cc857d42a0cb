"""Prompts read from JSONL or Parquet files in VERL's or TRL's row layout.

VERL: `prompt` (chat list or string), `reward_model.ground_truth`, optional `data_source`, `extra_info`.
TRL: `prompt` (string or chat list), optional answer column `solution`, `answer` or `ground_truth`;
other columns go to extra_info.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlhfless.data.prompts import DataError, Prompt, make_uid, with_system_prompt
from rlhfless.inputs import check_file, first_line, iter_lines, read_json_value

ROLES = ("system", "user", "assistant")
TRL_ANSWER_COLUMNS = ("solution", "answer", "ground_truth")
PROMPT_EXPECTED = "a string or a list of {role, content} chat messages"


class _Row:
    """One row being converted; its errors carry file, row number and field."""

    def __init__(self, path: Path, number: int, data: Any):
        self.path, self.number, self.data = path, number, data

    def error(self, name: str, problem: str, expected: str) -> DataError:
        return DataError(f"{self.path}: row {self.number}: field '{name}': {problem}, expected {expected}")

    @property
    def chat(self) -> bool:
        """Whether the row's prompt is chat messages, not one string."""
        return isinstance(self.data.get("prompt"), list)

    def messages(self) -> list[dict[str, str]]:
        if "prompt" not in self.data:
            raise self.error("prompt", "missing", PROMPT_EXPECTED)
        value = self.data["prompt"]
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        if not isinstance(value, list) or not value:
            got = "an empty list" if value == [] else "null" if value is None else type(value).__name__
            raise self.error("prompt", f"got {got}", PROMPT_EXPECTED)
        messages = []
        for i, message in enumerate(value):
            if not isinstance(message, dict):
                raise self.error(f"prompt[{i}]", f"got {type(message).__name__}", "a {role, content} mapping")
            if message.get("role") not in ROLES:
                raise self.error(f"prompt[{i}].role", f"got {message.get('role')!r}", f"one of {ROLES}")
            if not isinstance(message.get("content"), str):
                raise self.error(f"prompt[{i}].content", f"got {message.get('content')!r}", "a string")
            messages.append({"role": message["role"], "content": message["content"]})
        return messages

    def answer(self, value: Any, name: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.error(name, f"got {type(value).__name__}", "a string or a number")
        return str(value)


def _read_jsonl(path: Path, max_bytes: int) -> Iterator[tuple[int, Any]]:
    for number, line in iter_lines(path, "a JSONL file of prompts", max_bytes):
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}: row {number}: invalid JSON ({e.msg}; truncated?), expected one object per line"
            ) from None


def _json_array(path: Path) -> bool:
    """Whether a `.json` file holds one JSON array (as `json.dump(rows)` writes), not JSONL."""
    with path.open("rb") as handle:
        head = handle.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


def _read_json_array(path: Path, max_bytes: int) -> Iterator[tuple[int, Any]]:
    """The rows of a JSON array, numbered from 1 as items (the file is read whole: within
    `data.max_file_mb`)."""
    yield from enumerate(read_json_value(path, "a JSON array of prompt rows", max_bytes), start=1)


def _read_parquet(path: Path, max_bytes: int) -> Iterator[tuple[int, Any]]:
    """Rows streamed a record batch at a time, so only one batch is ever converted to Python."""
    import pyarrow.parquet as pq

    check_file(path, "a Parquet file of prompts", max_bytes)
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
        number = 0
        for batch in batches:
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(
            f"{path}: not a readable Parquet file ({first_line(e)}), expected Parquet rows"
        ) from None


def read_rows(path: Path, max_bytes: int) -> Iterator[tuple[int, Any]]:
    """(1-based row number, row object) pairs; JSONL counts lines, so numbers match an editor's.

    Files over `max_bytes` are refused before they are read (`data.max_file_mb`).
    """
    if path.is_dir():
        raise DataError(
            f"{path}: is a directory, expected a .jsonl, .json or .parquet file (a `datasets` folder "
            "saved with save_to_disk: load_from_disk(DIR).to_parquet('train.parquet'))"
        )
    if not path.is_file():
        raise DataError(f"{path}: data file not found")
    suffix = path.suffix.lower()
    if suffix == ".json" and _json_array(path):
        return _read_json_array(path, max_bytes)
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(path, max_bytes)
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path, max_bytes)
    raise DataError(f"{path}: unknown file type {suffix!r}, expected .jsonl or .parquet")


def _verl_prompt(row: _Row, index: int, system_prompt: str, default_source: str) -> Prompt:
    messages = with_system_prompt(row.messages(), system_prompt)
    reward_model = row.data.get("reward_model")
    if not isinstance(reward_model, dict):
        raise row.error(
            "reward_model",
            "missing" if "reward_model" not in row.data else f"got {reward_model!r:.40}",
            "a mapping with ground_truth",
        )
    if "ground_truth" not in reward_model:
        raise row.error("reward_model.ground_truth", "missing", "a string or a number")
    ground_truth = row.answer(reward_model["ground_truth"], "reward_model.ground_truth")
    data_source = row.data.get("data_source", default_source)
    if not isinstance(data_source, str):
        raise row.error("data_source", f"got {type(data_source).__name__}", "a string")
    extra_info = row.data.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise row.error("extra_info", f"got {type(extra_info).__name__}", "a mapping")
    uid = make_uid(data_source, index, messages)
    return Prompt(uid, messages, ground_truth, data_source, extra_info, chat=row.chat)


def _trl_prompt(row: _Row, index: int, system_prompt: str, default_source: str) -> Prompt:
    messages = with_system_prompt(row.messages(), system_prompt)
    column = next((c for c in TRL_ANSWER_COLUMNS if c in row.data), None)
    ground_truth = row.answer(row.data[column], column) if column else None
    # Every column but the prompt, the answer's too under its own name: a TRL reward function
    # takes them as keyword arguments (`solution=...`).
    extra_info = {k: v for k, v in row.data.items() if k != "prompt"}
    uid = make_uid(default_source, index, messages)
    return Prompt(uid, messages, ground_truth, default_source, extra_info, chat=row.chat)


def load_file_prompts(
    path: str | Path, fmt: str, system_prompt: str, max_bytes: int = 1 << 30
) -> list[Prompt]:
    """Read every row of a JSONL/Parquet file; the first bad row stops with a DataError."""
    path = Path(path)
    prompts: list[Prompt] = []
    convert = None
    for index, (number, data) in enumerate(read_rows(path, max_bytes)):
        row = _Row(path, number, data)
        if not isinstance(data, dict):
            raise DataError(
                f"{path}: row {number}: got {type(data).__name__}, expected an object with 'prompt'"
            )
        if convert is None:
            layout = fmt if fmt != "auto" else ("verl" if "reward_model" in data else "trl")
            convert = _verl_prompt if layout == "verl" else _trl_prompt
        prompt = convert(row, index, system_prompt, path.stem)
        prompt.origin = f"{path}: row {number}"
        prompts.append(prompt)
    if not prompts:
        raise DataError(f"{path}: no rows, expected at least one prompt")
    return prompts
