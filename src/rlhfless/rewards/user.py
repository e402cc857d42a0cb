"""A user's reward function (`reward.function`), called in the convention it was written for,
so that a VERL or TRL reward function works as it is:

- ours, `f(prompt, response) -> float`, with the `data.Prompt` (its ground truth, data source,
  extra info and messages);
- VERL's `compute_score(data_source, solution_str, ground_truth, extra_info)`, known by its
  `solution_str` parameter, returning a number or `{"score": number, ...}`;
- TRL's `f(prompts, completions, **columns) -> list[float | None]`, known by its `completions`
  parameter, a batch at a time: each prompt and completion as chat messages where the data gave
  the prompt as messages, else as a string, and every other column of the data as a keyword
  argument of one value per pair (the answer too, under any of TRL's names the function takes). A
  None counts 0, as in TRL's sum over one function.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlhfless.data.files import TRL_ANSWER_COLUMNS
from rlhfless.data.gym import GYM_KEY
from rlhfless.data.prompts import Prompt
from rlhfless.inputs import first_line

UserReward = Callable[[list[Prompt], list[str]], list[Any]]


class RewardError(Exception):
    """A reward that cannot be computed (unimportable or misbehaving user function)."""


def load_user_function(spec: str) -> UserReward:
    """'module:function' or 'path/to/file.py:function' (VERL's `custom_reward_function.path`), as
    a scorer of pairs: one score per (prompt, response). The error says which part failed."""
    fn = _import(spec)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: called as f(prompt, response)
        params = {}
    if "completions" in params:
        return _trl(fn, params, spec)
    if "solution_str" in params:
        return _verl(fn, params)
    return lambda prompts, responses: [fn(p, r) for p, r in zip(prompts, responses, strict=True)]


def _import(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py"):
            module = _module_from_file(Path(module_name).expanduser())
        else:
            module = importlib.import_module(module_name)
    except Exception as e:  # trusted code, but a broken file (syntax, bytes) is still one line
        where = getattr(e, "filename", None)
        at = f" ({where}, line {e.lineno})" if isinstance(e, SyntaxError) and where else ""
        raise RewardError(
            f"reward.function: cannot import module {module_name!r}{at}: {type(e).__name__}: {first_line(e)}"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"reward.function: module {module_name!r} has no callable {attr!r}")
    return fn


def _module_from_file(path: Path) -> Any:
    """The Python file at `path` as a module (not put in `sys.modules`)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"rlhfless_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _takes_any(params: Mapping[str, inspect.Parameter]) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in params.values())


def _verl(fn: Callable[..., Any], params: Mapping[str, inspect.Parameter]) -> UserReward:
    extra = "extra_info" in params or _takes_any(params)

    def one(prompt: Prompt, response: str) -> Any:
        info = {"extra_info": prompt.extra_info} if extra else {}
        value = fn(
            data_source=prompt.data_source, solution_str=response, ground_truth=prompt.ground_truth, **info
        )
        return value.get("score", value) if isinstance(value, dict) else value  # VERL's dict result

    return lambda prompts, responses: [one(p, r) for p, r in zip(prompts, responses, strict=True)]


def _trl(fn: Callable[..., Any], params: Mapping[str, inspect.Parameter], spec: str) -> UserReward:
    def batch(prompts: list[Prompt], responses: list[str]) -> list[Any]:
        columns: dict[str, list[Any]] = {}
        for key in dict.fromkeys(k for p in prompts for k in p.extra_info if k != GYM_KEY):
            columns[key] = [p.extra_info.get(key) for p in prompts]
        for name in TRL_ANSWER_COLUMNS:  # reasoning-gym's and VERL's answers, as TRL names them
            if name in params and name not in columns:
                columns[name] = [p.ground_truth for p in prompts]
        columns["prompts"] = [p.messages if p.chat else p.question for p in prompts]
        if not _takes_any(params):  # what it names, where it takes no **kwargs
            columns = {k: v for k, v in columns.items() if k in params}
        completions = [
            [{"role": "assistant", "content": r}] if p.chat else r
            for p, r in zip(prompts, responses, strict=True)
        ]
        values = fn(completions=completions, **columns)
        if not isinstance(values, list | tuple) or len(values) != len(prompts):
            got = f"{len(values)} values" if isinstance(values, list | tuple) else repr(values)[:40]
            raise RewardError(
                f"reward.function {spec}: returned {got} for {len(prompts)} completions, expected "
                "one score each (TRL's convention: it takes `completions`)"
            )
        return [0.0 if v is None else v for v in values]

    return batch
