"""`rlhfless profile`: the prefill/decode time table the planner and the simulator read.

`--simulated` derives it from a model shape and a GPU spec (roofline, no torch imported); without
it the real engine is timed on dummy batches on this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rlhfless.files import write_atomic
from rlhfless.inputs import check_writable

SIMULATED_KEYS = {
    "gpu": "built-in GPU (h100, h200, a100, l40s) or a JSON file with a GpuSpec dict",
    "model": "built-in shape (qwen2.5-3b, qwen2.5-7b, llama-2-7b, llama-2-70b, smollm2-135m) "
    "or a config.json",
    "tp": "tensor-parallel GPUs per actor",
    "step_overhead_ms": "fixed per decode step (scheduler, sampling, launches)",
    "per_sequence_overhead_ms": "per running sequence per step",
    "memory_utilization": "share of GPU memory the engine may use",
}


MEASURED_GRID = {
    "batches": ((1, 2, 4, 8, 16, 32, 64), "decode batch sizes timed, comma-separated"),
    "contexts": ((1, 128, 256, 512, 1024), "decode context lengths timed, comma-separated"),
    "prefill_tokens": ((1, 64, 256, 1024), "prefill lengths timed, comma-separated"),
}
MEASURED_KEYS = {
    **{key: help_ for key, (_, help_) in MEASURED_GRID.items()},
    "repeats": "timed runs per point (the median is kept), after one warm-up",
    "memory_fraction": "share of free memory the KV capacity may use",
    "kv_budget_gb": "the most KV one timed decode point may hold (default: no limit); a point past "
    "it is extended from its batch's last two timed contexts",
    "packed_weights": "true (default) or false: linear layers on weights reordered once, as decode "
    "functions run them with generation.packed_weights (a float32 model on a CPU only)",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("profile", help="print the planner's time table (measured or derived)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="simulated: "
        + "; ".join(f"{k}: {v}" for k, v in SIMULATED_KEYS.items())
        + ". measured: model.* config keys (model=PATH is short for model.path=PATH); "
        + "; ".join(f"{k}: {v}" for k, v in MEASURED_KEYS.items()),
    )
    parser.add_argument("--simulated", action="store_true", help="derive from specs instead of measuring")
    parser.add_argument("--json", action="store_true", help="print the whole table as JSON")
    parser.add_argument("--output", type=Path, help="also write the JSON table to this file")


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override: got {item!r}, expected key=value")
        out[key] = value
    return out


def _parsed(key: str, value: str, kind: type) -> Any:
    """`value` as an int or a float, else a ValueError naming `key`."""
    try:
        return kind(value)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise ValueError(f"{key}: got {value!r}, expected {expected}") from None


def _gpu_arg(value: str) -> str | dict[str, Any]:
    return json.loads(Path(value).read_text()) if value.endswith(".json") and Path(value).is_file() else value


def simulated_table(options: dict[str, str]) -> dict[str, Any]:
    from rlhfless.planner.hardware import roofline_table

    unknown = set(options) - set(SIMULATED_KEYS)
    if unknown:
        raise ValueError(
            f"profile --simulated: got unknown keys {sorted(unknown)}, expected {sorted(SIMULATED_KEYS)}"
        )
    knobs = {
        k: _parsed(k, options[k], float)
        for k in ("step_overhead_ms", "per_sequence_overhead_ms", "memory_utilization")
        if k in options
    }
    return roofline_table(
        options.get("model", "llama-2-7b"),
        _gpu_arg(options.get("gpu", "h100")),
        _parsed("tp", options.get("tp", "1"), int),
        **knobs,
    )


def measured_table(options: dict[str, str]) -> dict[str, Any]:
    """Time the real engine on dummy batches; torch is imported only here."""
    from rlhfless.config import ModelConfig

    grid = {
        key: tuple(_parsed(key, v, int) for v in options.pop(key).split(",")) if key in options else default
        for key, (default, _) in MEASURED_GRID.items()
    }
    repeats = _parsed("repeats", options.pop("repeats", "3"), int)
    memory_fraction = _parsed("memory_fraction", options.pop("memory_fraction", "0.5"), float)
    budget = options.pop("kv_budget_gb", None)
    kv_budget_bytes = None if budget is None else int(_parsed("kv_budget_gb", budget, float) * 2**30)
    if kv_budget_bytes is not None and kv_budget_bytes < 1:
        raise ValueError(f"kv_budget_gb: got {budget!r}, expected a positive number of GiB")
    packed = options.pop("packed_weights", "true").lower()
    if packed not in ("true", "false"):
        raise ValueError(f"packed_weights: got {packed!r}, expected true or false")
    fields = {k.removeprefix("model."): v for k, v in options.items()}
    if "model" in fields:
        fields["path"] = fields.pop("model")
    types = {name: str(f.type) for name, f in ModelConfig.__dataclass_fields__.items()}
    unknown = set(fields) - set(types)
    if unknown:
        raise ValueError(
            f"profile: got unknown keys {sorted(unknown)}, expected model.* keys "
            f"({', '.join(sorted(types))}) or {', '.join(MEASURED_KEYS)}"
        )
    parse = {
        "int": lambda k, v: _parsed(f"model.{k}", v, int),
        "bool": lambda k, v: v.lower() in ("1", "true", "yes"),
    }
    values = {k: parse[types[k]](k, v) if types[k] in parse else v for k, v in fields.items()}
    try:
        cfg = ModelConfig(**values)
    except ValueError as err:
        raise ValueError(f"model.{err}") from None
    from rlhfless.engine.profiling import measure_profile
    from rlhfless.models import load_model, load_tokenizer
    from rlhfless.runtime.machine import function_start_s

    begin = time.perf_counter()
    model = load_model(cfg, vocab_size=len(load_tokenizer(cfg)))
    load_s = time.perf_counter() - begin
    table = measure_profile(
        model,
        **grid,
        repeats=repeats,
        memory_fraction=memory_fraction,
        packed_weights=packed == "true",
        kv_budget_bytes=kv_budget_bytes,
    )
    # A function's cold start: a fresh interpreter's imports, and this model's load.
    table["cold_start_s"] = function_start_s() + load_s
    return table


def summary(table: dict[str, Any]) -> str:
    """A few landmark rows for a human; --json gives everything."""
    decode = {(row["batch"], row["context"]): row["ms"] for row in table["decode"]}
    prefill = {row["tokens"]: row["ms"] for row in table["prefill"]}
    start = f"   function cold start: {table['cold_start_s']:.1f} s" if table.get("cold_start_s") else ""
    lines = [
        f"gpus per actor: {table['gpus']}   KV capacity: {table['max_kv_tokens']:,} tokens{start}",
        "decode ms per step:",
    ]
    contexts = sorted({c for _, c in decode})
    shown = [c for c in contexts if c in (1, 1024, 4096, 8192)] or contexts[:3]
    lines.append("  batch " + "".join(f"{f'ctx {c}':>11}" for c in shown))
    for b in sorted({b for b, _ in decode}):
        lines.append(f"  {b:5d} " + "".join(f"{decode[(b, c)]:11.2f}" for c in shown))
    lines.append(
        "prefill ms: "
        + ", ".join(f"{n} tok {prefill[n]:.1f}" for n in sorted(prefill) if n in (1, 1024, 4096, 8192))
    )
    if table.get("extended"):
        points = ", ".join(f"{p['batch']}x{p['context']}" for p in table["extended"])
        lines.append(f"decode points extended, not timed (kv_budget_gb): {points}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        if args.output:  # before the minutes a measured table takes
            check_writable(args.output, "--output")
        options = parse_overrides(args.overrides)
        table = simulated_table(options) if args.simulated else measured_table(options)
    except (ValueError, RuntimeError, OSError) as err:
        print(f"rlhfless profile: {err}", file=sys.stderr)
        return 2
    text = json.dumps(table)
    if args.output:
        write_atomic(args.output, text + "\n")
    print(text if args.json else summary(table))
    return 0
