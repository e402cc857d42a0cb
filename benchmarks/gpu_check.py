"""The GPU machine check: GRPO steps of a random-weight Qwen2.5-0.5B-shaped model under verl and
rlhfless on the chosen device (on a GPU also rlhfless without CUDA graphs), every run's samples
compared with verl's step by step, and sample identity between CPU and device decode functions.

Written on a 2-core CPU machine with no GPU, where the whole path runs with `--model tiny`. Run it
through `scripts/gpu_check.sh` on a GPU machine: on one lent H200 it took about 4 minutes (session
29, docs/MEASUREMENTS.md). It also times an engine's decode step, with the attention span exact and
rounded and on a GPU as CUDA graphs, against a bare forward and a bare sampling call of the same
batch (part d, `bench_span`).

    python benchmarks/gpu_check.py --device cuda --model qwen2.5-0.5b --steps 3
    python benchmarks/gpu_check.py --device cpu --model tiny --steps 1     # the path, on a CPU

Nothing is downloaded: the model is built from a config in code (hidden 896, 24 layers, 14 heads,
2 KV heads, intermediate 4864, vocabulary 151936, tied embeddings) with random weights, saved with
a synthetic byte-level tokenizer of the same vocabulary size, and trained as `model.path=DIR`.
Its rewards are all but zero (random text), so the check measures time and cost, not learning.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import ray
import torch
from bench_precision import batch_invariance
from bench_span import decode_breakdown, identical, variants
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rlhfless.config import load_config
from rlhfless.devices import resolve_device
from rlhfless.engine.sampling import SamplingParams
from rlhfless.models import CHATML_TEMPLATE, load_model, load_tokenizer
from rlhfless.runtime.functions import DecodeFunction
from rlhfless.runtime.ray_cluster import start_ray
from rlhfless.runtime.trainer import train
from rlhfless.runtime.transfer import flat_weights

SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
    ),
    # The same architecture, small enough for a CPU test of the whole path.
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1024,
    ),
}
# Per model: the preset and the data shape of the GRPO steps (qwen: the default run's shape).
RUNS = {
    # Byte-level prompts are longer than Qwen's own tokenizer would make them.
    "qwen2.5-0.5b": ("default", ("generation.max_prompt_tokens=4096",)),
    "tiny": ("tiny", ("data.batch_size=2", "algorithm.group_size=2", "generation.max_new_tokens=8")),
}
POLICIES = ("verl", "rlhfless")


def runs(device: str) -> dict[str, tuple[str, ...]]:
    """The GRPO runs compared, by label: each policy, and on a GPU rlhfless again without CUDA
    graphs (`generation.cuda_graphs=false`: every decode step's kernels launched one by one)."""
    out = {p: (f"scheduler.policy={p}",) for p in POLICIES}
    if device == "cuda":
        out["rlhfless-eager"] = ("scheduler.policy=rlhfless", "generation.cuda_graphs=false")
    return out


def synthetic_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with `vocab` entries: the 256 bytes, then strings of byte symbols
    (decodable, never produced by tokenizing: there are no merges), then the special tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    entries = list(alphabet)
    n_plain = vocab - 3
    for a in alphabet:
        for b in alphabet:
            if len(entries) >= n_plain:
                break
            entries.append(a + b)
    i = 0
    while len(entries) < n_plain:  # past 256 + 256^2: three symbols
        entries.append(alphabet[i % 256] + alphabet[(i // 256) % 256] + alphabet[i // 65536 % 256])
        i += 1
    backend = Tokenizer(models.BPE(vocab={t: n for n, t in enumerate(entries)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_model_dir(name: str, root: Path) -> Path:
    """A random-weight Qwen2 model of shape `name` with its tokenizer, as a checkpoint directory."""
    shape = SHAPES[name]
    config = Qwen2Config(
        **shape,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    target = root / name
    model.save_pretrained(target)
    tokenizer = synthetic_tokenizer(shape["vocab_size"])
    assert len(tokenizer) == shape["vocab_size"], (len(tokenizer), shape["vocab_size"])
    tokenizer.save_pretrained(target)
    return target


def run_name(label: str) -> str:
    """A run's directory under the check's output."""
    return label.replace("-", "_")


def same_samples(a: Path, b: Path) -> dict[str, tuple[int, int]]:
    """Per step: (samples of run `b` token-identical to run `a`'s, samples of `a`)."""

    def tokens(run: Path, step: str) -> dict:
        lines = (run / "rollouts" / f"{step}.jsonl").read_text().splitlines()
        return {(r["uid"], r["sample"]): r["response"] for r in map(json.loads, filter(None, lines))}

    out = {}
    for f in sorted((a / "rollouts").glob("step_*.jsonl")):
        ta, tb = tokens(a, f.stem), tokens(b, f.stem) if (b / "rollouts" / f.name).exists() else {}
        out[f.stem] = (sum(tb.get(k) == v for k, v in ta.items()), len(ta))
    return out


def grpo_steps(label: str, model_dir: Path, preset: str, extra: tuple[str, ...], args, out: Path) -> dict:
    """`rlhfless train` on the Ray executor with the `extra` overrides: step times and costs."""
    # this benchmark's own run: a rerun into --out replaces it
    shutil.rmtree(out / run_name(label), ignore_errors=True)
    cfg = load_config(
        preset=preset,
        overrides=(
            f"model.path={model_dir}",
            "runtime.executor=ray",
            f"runtime.device={args.device}",
            f"trainer.steps={args.steps}",
            f"output_dir={out / run_name(label)}",
            "trainer.save_every=0",
            "trainer.report=false",
            "trainer.progress=false",
            "trainer.tensorboard=false",
            f"model.cache_dir={out / 'cache'}",
            *extra,
        ),
    )
    start = time.perf_counter()
    history = train(cfg).history
    for h in history:
        print(
            f"{label} step {h['step']}: {h['time/step']:.2f} s (generation {h['time/generation']:.2f}, "
            f"learning {h['time/learning']:.2f}), ${h['cost/step']:.5f}",
            flush=True,
        )
    rows = history[1:] or history  # the first step pays the cold starts
    return {
        "step_s": statistics.fmean(h["time/step"] for h in rows),
        "generation_s": statistics.fmean(h["time/generation"] for h in rows),
        "learning_s": statistics.fmean(h["time/learning"] for h in rows),
        # Busy seconds summed over the step's functions, and the prompt tokens they computed:
        # where the policies' generation differs on one GPU (one slot, the same schedule).
        "prefill_s": statistics.fmean(h.get("time/prefill", 0.0) for h in rows),
        "decode_s": statistics.fmean(h.get("time/decode", 0.0) for h in rows),
        "prompt_tokens": statistics.fmean(h.get("prefill/tokens_computed", 0.0) for h in rows),
        "cost": statistics.fmean(h["cost/step"] for h in rows),
        "steps": len(history),
        "wall_s": time.perf_counter() - start,
    }


def sample_identity(model_dir: Path, device: str, new_tokens: int) -> tuple[int, int, int]:
    """Decode functions on the CPU and on `device`, float32 on both, the same seed: (sequences,
    identical on `device`, identical after a cut on the CPU and a resume on `device` with KV)."""
    cfg = resolve_device(
        load_config(preset="tiny", overrides=(f"model.path={model_dir}", "model.dtype=float32"))
    )
    tokenizer = load_tokenizer(cfg.model)
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    flat = flat_weights(load_model(cfg.model, vocab, cfg.seed))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=11)
    g = torch.Generator().manual_seed(5)
    work = [
        (f"p{i}", torch.randint(0, 256, (12 + 3 * i,), generator=g).tolist(), [0, 1], None) for i in range(8)
    ]

    def function(where: str) -> DecodeFunction:
        fn = DecodeFunction(cfg.model, vocab, cfg.seed, [eos], tokenizer.pad_token_id, 16, 8, where)
        fn.hello()  # the model loads here
        fn.sync(flat, 0)
        return fn

    def finish(fn: DecodeFunction) -> dict:
        out: dict = {}
        while True:
            report = fn.advance(3600.0)
            out |= {(r.uid, r.sample): r.response_ids for r in report.results}
            if not report.live:
                return out

    def run(where: str) -> dict:
        fn = function(where)
        fn.assign(work, None, params, 1, [])
        return finish(fn)

    reference = run("cpu")
    direct = run(device)
    source, target = function("cpu"), function(device)
    source.assign(work, None, params, 1, [])
    for _ in range(new_tokens // 2):
        source.engine.step()
    keys = [(uid, s) for uid, _, samples, _ in work[::2] for s in samples]
    moved, _ = source.cut([keys], with_kv=True)
    target.resume(moved, params, 1)
    migrated = finish(source)
    migrated |= finish(target)
    same = sum(direct.get(k) == v for k, v in reference.items())
    same_migrated = sum(migrated.get(k) == v for k, v in reference.items())
    return len(reference), same, same_migrated


def rollout_invariance(model_dir: Path, device: str, new_tokens: int) -> dict[str, tuple[int, int]]:
    """Per rollout dtype on `device`: (sequences, identical) between one batch and each prompt
    alone (`bench_precision.batch_invariance`). The run's rollouts (`model.dtype=auto`: float32)
    must keep all; bfloat16 is measured to show why they are not bfloat16."""
    cfg = load_config(preset="tiny", overrides=(f"model.path={model_dir}", "model.dtype=float32"))
    tokenizer = load_tokenizer(cfg.model)
    model = load_model(cfg.model, len(tokenizer), cfg.seed, device)
    return {
        name: batch_invariance(model.to(getattr(torch, name)), tokenizer, new_tokens)
        for name in ("float32", "bfloat16")
    }


def guarded(label: str, part, *args):
    """`part(*args)`, or None with its traceback printed: one run on a lent machine reports every
    part, a failed one included."""
    try:
        return part(*args)
    except Exception:  # reported, and counted as a failure
        print(f"gpu_check: {label} FAILED", flush=True)
        traceback.print_exc()
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=tuple(SHAPES))
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per policy (the first is left out)")
    parser.add_argument("--identity-tokens", type=int, default=32, help="new tokens per identity sequence")
    parser.add_argument(
        "--out", type=Path, help="keep run directories here (default: a temp dir, removed at exit)"
    )
    args = parser.parse_args()
    scratch = None if args.out else tempfile.TemporaryDirectory(prefix="gpu_check.")  # gone at exit
    out = args.out or Path(scratch.name)
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"gpu_check: model {args.model} (random weights), device {args.device} ({where})", flush=True)
    start = time.perf_counter()
    model_dir = build_model_dir(args.model, out)
    print(f"model built and saved in {time.perf_counter() - start:.1f} s", flush=True)

    start = time.perf_counter()
    identity = guarded("sample identity", sample_identity, model_dir, args.device, args.identity_tokens)
    print(f"sample identity checked in {time.perf_counter() - start:.1f} s", flush=True)
    if identity:
        n, same, same_migrated = identity
        print(f"sample identity, cpu vs {args.device} functions: {same}/{n} identical", flush=True)
        print(
            f"sample identity, cut on cpu, resumed on {args.device}: {same_migrated}/{n} identical",
            flush=True,
        )

    invariance = guarded("batch invariance", rollout_invariance, model_dir, args.device, args.identity_tokens)
    for dtype, (n_seq, same_seq) in (invariance or {}).items():
        print(
            f"{dtype} rollouts on {args.device}, one batch of {n_seq} against each prompt alone: "
            f"{same_seq}/{n_seq} identical",
            flush=True,
        )

    d = guarded("decode breakdown", decode_breakdown, str(model_dir), args.device, 160, 8, 4)
    for name, kwargs in variants(args.device).items() if d else ():
        r = d[name]
        print(
            f"engine on {args.device}, {name} {kwargs}: {d['batch']} sequences x 160 tokens in "
            f"{r['wall_s']:.2f} s, a decode step {r['step_ms']:.1f} ms ({r['first_step_ms']:.1f} ms the "
            "first time)",
            flush=True,
        )
    if d:
        same, n = identical(d)
        print(
            f"a bare decode forward of that batch {d['forward_ms']:.1f} ms, a bare sampling call "
            f"{d['sample_ms']:.1f} ms; sequences identical in every engine run: {same}/{n}",
            flush=True,
        )
        if "graphs" in variants(args.device):
            print(
                f"CUDA graphs held by the graphs engine: {d['captured']} (0: it decoded eagerly)", flush=True
            )

    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()  # the peak below is the training run's
    preset, extra = RUNS[args.model]
    start_ray(
        resolve_device(load_config(preset=preset, overrides=(f"runtime.device={args.device}",))).runtime
    )
    results = {
        label: guarded(f"{label} steps", grpo_steps, label, model_dir, preset, (*extra, *more), args, out)
        for label, more in runs(args.device).items()
    }
    ray.shutdown()
    if all(results.values()):
        labels = list(results)
        print(f"\n{'':24s}" + "".join(f"{label:>16s}" for label in labels) + f"{'rlhfless/verl':>15s}")
        for key, name in (
            ("step_s", "step time (s)"),
            ("generation_s", "generation time (s)"),
            ("learning_s", "learning time (s)"),
            ("prefill_s", "prefill busy (s)"),
            ("decode_s", "decode busy (s)"),
            ("prompt_tokens", "prompt tokens computed"),
            ("cost", "cost per step ($)"),
        ):
            a, b = results["verl"][key], results["rlhfless"][key]
            row = "".join(f"{results[label][key]:16.6g}" for label in labels)
            print(f"{name:24s}{row}{b / a if a else float('nan'):15.3f}")
        print(f"(means over steps 2..{args.steps}; step 1 pays the cold starts; device {args.device})")
        for label in labels[1:]:
            steps = same_samples(out / run_name("verl"), out / run_name(label))
            same, n = (sum(column) for column in zip(*steps.values(), strict=True))
            each = ", ".join(f"{s}/{k}" for s, k in steps.values())
            print(f"{label}: {same}/{n} samples token-identical to verl's (steps: {each})", flush=True)
            results[label]["identical"] = same == n
    for label, r in results.items():
        if r:
            print(f"{label}: {r['steps']} steps in {r['wall_s']:.0f} s, set-up and cold starts included")
    if args.device == "cuda":
        print(f"driver's peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)
    ok = (
        identity is not None
        and invariance is not None
        and invariance["float32"][0] == invariance["float32"][1]
        and d is not None
        and identical(d)[0] == identical(d)[1]
        and identity[1] == identity[0] == identity[2]
        and all(r and np.isfinite(r["step_s"]) and r.get("identical", True) for r in results.values())
    )
    print("gpu_check:", "ok" if ok else "FAILED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
