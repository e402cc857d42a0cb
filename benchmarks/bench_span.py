"""A decode step's time with the attention span exact and rounded (`Engine(span_quantum=...)`), side
by side in one process, against a bare decode forward and a bare sampling call of the same batch.

The engine rounds each decode step's span up to `engine.forward.SPAN_QUANTUM` positions so that steps
repeat shapes. On a lent H200 (session 27) an exact-span decode step of a Qwen2.5-0.5B-shaped model
took 80.8 ms against a bare forward's 19.3 ms, and each step was a new shape, for which cuDNN's
attention builds a graph: the lead this measures. Run it on the machine at hand;
`scripts/gpu_check.sh` runs it on a GPU.

On a GPU it also times the decode steps replayed as CUDA graphs (`generation.cuda_graphs`).

    .venv/bin/python benchmarks/bench_span.py [--device cpu] [--model-path smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from functools import partial

import torch

from rlhfless.config import load_config
from rlhfless.devices import resolve_device
from rlhfless.engine.engine import Engine
from rlhfless.engine.forward import SPAN_QUANTUM
from rlhfless.engine.profiling import measure_profile, median_ms
from rlhfless.engine.sampling import SamplingParams, sample_tokens, token_seed
from rlhfless.engine.sequences import Request
from rlhfless.models import load_model, load_tokenizer


def variants(device: str) -> dict[str, dict]:
    """The engines compared, by name: the exact span (every step a new shape), the engine's
    default (span rounded up to `SPAN_QUANTUM`) and, on a GPU, its decode steps replayed as CUDA
    graphs (`generation.cuda_graphs`)."""
    out = {"exact": {"span_quantum": 1}, "rounded": {"span_quantum": SPAN_QUANTUM}}
    if torch.device(device).type == "cuda":
        out["graphs"] = {"span_quantum": SPAN_QUANTUM, "cuda_graphs": True}
    return out


def decode_breakdown(model_path: str, device: str, new_tokens: int, prompts: int, group: int) -> dict:
    """Where an engine's decode step goes on `device`, in the run's dtype: the whole step (forward,
    sampling and bookkeeping) of `prompts` x `group` sequences of `new_tokens`, under each of
    `variants` (run in that order, then the reverse, so the machine's drift falls on all alike;
    means), each engine generating the same batch twice: `first_step_ms` meets every shape for the
    first time (a CUDA graph's capture, an attention plan), `step_ms` again. Against one bare
    decode forward and one bare sampling call of the same batch (ms, medians)."""
    cfg = resolve_device(
        load_config(preset="default", overrides=(f"model.path={model_path}", f"runtime.device={device}"))
    )
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, len(tokenizer), cfg.seed, device)
    g = torch.Generator().manual_seed(3)
    requests = [
        Request(f"p{i}", torch.randint(9, 256, (200,), generator=g).tolist(), group) for i in range(prompts)
    ]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=11)
    batch = prompts * group
    kinds = variants(device)
    runs: dict[str, list] = {name: [] for name in kinds}
    graphs = 0
    for name in [*kinds, *reversed(kinds)]:
        engine = Engine(
            model, eos_token_ids=[-1], pad_token_id=tokenizer.pad_token_id, max_running=batch, **kinds[name]
        )
        engine.generate(requests[:1], replace(params, max_new_tokens=4), 0)  # kernels, allocator
        passes = []
        for _ in range(2):  # a run's first step meets each shape first; later steps meet it again
            before = replace(engine.stats)
            start = time.perf_counter()
            results = engine.generate(requests, params, 1)
            stats = engine.stats.minus(before)
            passes.append(
                (time.perf_counter() - start, stats.decode_seconds / max(1, stats.decode_steps), results)
            )
        runs[name].append(passes)
        if engine.static is not None and engine.static.graphs:  # else eager: none, or a capture failed
            graphs = engine.static.captured
    out: dict = {"batch": batch, "captured": graphs}
    for name, pairs in runs.items():
        first, again = [p[0] for p in pairs], [p[1] for p in pairs]
        out[name] = {
            "first_step_ms": 1000 * statistics.fmean(r[1] for r in first),
            "wall_s": statistics.fmean(r[0] for r in again),
            "step_ms": 1000 * statistics.fmean(r[1] for r in again),
            "tokens": [[r.response_ids for r in run[2]] for p in pairs for run in p],
        }
    bare = measure_profile(
        model, batches=[batch], contexts=[200 + new_tokens // 2], prefill_tokens=[], repeats=5
    )
    logits = torch.randn(batch, model.config.vocab_size, device=model.device, dtype=torch.float32)
    seeds = [token_seed(i, 0) for i in range(batch)]
    sample_ms = median_ms(partial(sample_tokens, logits, params, seeds), 5, model.device)
    return out | {"forward_ms": bare["decode"][0]["ms"], "sample_ms": sample_ms}


def identical(d: dict) -> tuple[int, int]:
    """(the fewest sequences of any run identical to the first exact-span run's, sequences)."""
    reference = d["exact"]["tokens"][0]
    runs = [run for name in d if isinstance(d[name], dict) for run in d[name]["tokens"]]
    return min(sum(a == b for a, b in zip(reference, run, strict=True)) for run in runs), len(reference)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--model-path", default="smollm2-135m-instruct", help="model.path (the default model)"
    )
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    args = parser.parse_args()
    d = decode_breakdown(args.model_path, args.device, args.new_tokens, args.prompts, args.group)
    print(f"{d['batch']} sequences x {args.new_tokens} new tokens on {args.device}")
    for name, kwargs in variants(args.device).items():
        r = d[name]
        print(
            f"decode step, {name:8s} {kwargs}: {r['step_ms']:8.1f} ms ({r['wall_s']:.2f} s in all; "
            f"{r['first_step_ms']:.1f} ms the first time)"
        )
        print(f"  {name} / exact: {r['step_ms'] / d['exact']['step_ms']:.3f}")
    print(f"bare decode forward {d['forward_ms']:.1f} ms, bare sampling call {d['sample_ms']:.1f} ms")
    if "graphs" in d:
        print(
            f"CUDA graphs held by the last graphs engine: {d['captured']} (0: eager; a failed capture is logged)"
        )
    same, n = identical(d)
    print(f"sequences identical in every run to the exact span's: {same}/{n}")
    return 0 if same == n else 1


if __name__ == "__main__":
    raise SystemExit(main())
