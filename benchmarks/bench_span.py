"""A decode step's time with the attention span exact and rounded (`Engine(span_quantum=...)`), side
by side in one process, against a bare decode forward and a bare sampling call of the same batch.

The engine rounds each decode step's span up to `engine.forward.SPAN_QUANTUM` positions so that steps
repeat shapes. On a lent H200 (session 27) an exact-span decode step of a Qwen2.5-0.5B-shaped model
took 80.8 ms against a bare forward's 19.3 ms, and each step was a new shape, for which cuDNN's
attention builds a graph: the lead this measures. Run it on the machine at hand;
`scripts/gpu_check.sh` runs it on a GPU.

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


def decode_breakdown(model_path: str, device: str, new_tokens: int, prompts: int, group: int) -> dict:
    """Where an engine's decode step goes on `device`, in the run's dtype: the whole step (forward,
    sampling and bookkeeping) of `prompts` x `group` sequences of `new_tokens`, with the attention
    span exact (`span_quantum=1`, every step a new shape) and rounded (the engine's default), each
    run twice (means), against one bare decode forward and one bare sampling call of the same
    batch (ms, medians)."""
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
    out: dict = {"batch": batch}
    runs: dict[int, list] = {1: [], SPAN_QUANTUM: []}
    for quantum in (1, SPAN_QUANTUM, SPAN_QUANTUM, 1):  # ABBA: the machine's drift falls on both
        engine = Engine(
            model,
            eos_token_ids=[-1],
            pad_token_id=tokenizer.pad_token_id,
            max_running=batch,
            span_quantum=quantum,
        )
        engine.generate(requests[:1], replace(params, max_new_tokens=4), 0)  # kernels, allocator
        before = replace(engine.stats)
        start = time.perf_counter()
        results = engine.generate(requests, params, 1)
        stats = engine.stats.minus(before)
        runs[quantum].append(
            (time.perf_counter() - start, stats.decode_seconds / max(1, stats.decode_steps), results)
        )
    for quantum, pair in runs.items():
        out[quantum] = {
            "wall_s": statistics.fmean(r[0] for r in pair),
            "step_ms": 1000 * statistics.fmean(r[1] for r in pair),
            "tokens": [[r.response_ids for r in results] for _, _, results in pair],
        }
    bare = measure_profile(
        model, batches=[batch], contexts=[200 + new_tokens // 2], prefill_tokens=[], repeats=5
    )
    logits = torch.randn(batch, model.config.vocab_size, device=model.device, dtype=torch.float32)
    seeds = [token_seed(i, 0) for i in range(batch)]
    sample_ms = median_ms(partial(sample_tokens, logits, params, seeds), 5, model.device)
    return out | {"forward_ms": bare["decode"][0]["ms"], "sample_ms": sample_ms}


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
    exact, rounded = d[1], d[SPAN_QUANTUM]
    print(f"{d['batch']} sequences x {args.new_tokens} new tokens on {args.device}")
    print(f"decode step, exact span:            {exact['step_ms']:8.1f} ms ({exact['wall_s']:.2f} s in all)")
    print(
        f"decode step, span rounded to {SPAN_QUANTUM:3d}:   {rounded['step_ms']:8.1f} ms ({rounded['wall_s']:.2f} s in all)"
    )
    print(f"rounded / exact:                    {rounded['step_ms'] / exact['step_ms']:8.3f}")
    print(f"bare decode forward {d['forward_ms']:.1f} ms, bare sampling call {d['sample_ms']:.1f} ms")
    reference = exact["tokens"][0]
    same = min(sum(a == b for a, b in zip(reference, run, strict=True)) for run in rounded["tokens"])
    print(f"sequences identical, exact vs rounded: {same}/{len(reference)}")
    return 0 if same == len(reference) else 1


if __name__ == "__main__":
    raise SystemExit(main())
