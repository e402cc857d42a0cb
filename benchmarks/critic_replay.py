"""Replay a PPO run's recorded rollouts through a fresh critic, under other critic settings.

Generation dominates a CPU step; this replays only the critic's part: step by step, the critic
scores the step's samples (its value loss on them before it learns from them, and the explained
variance) and then learns from them. It answers "would more critic epochs, another lambda or another
learning rate have fitted these very rollouts better?" without sampling anything again.

    python benchmarks/critic_replay.py RUN_DIR [--start STEP] [--steps N] [algorithm.key=value ...]

The run's own `config.yaml` gives the model and the defaults; the overrides change the critic's
settings (`algorithm.epochs`, `mini_batches`, `lam`, `critic_lr`, `value_clip`, `normalize_reward`).
Responses are re-tokenized from their recorded text, so figures can differ a little from the
run's (within 1% on the runs tried).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from rlhfless.algo import gae, value_loss
from rlhfless.algo.config import AlgorithmConfig
from rlhfless.config import load_config
from rlhfless.models import load_model, load_tokenizer
from rlhfless.runtime.critic import Critic, ValueModel
from rlhfless.runtime.samples import Sample, canonical
from rlhfless.runtime.trainer import token_rewards


def read_step(path: Path, tokenizer) -> list[Sample]:
    samples = []
    for line in path.read_text().split("\n"):
        if not line:
            continue
        r = json.loads(line)
        response = tokenizer(r["response"], add_special_tokens=False)["input_ids"][: r["response_tokens"]]
        samples.append(
            Sample(
                uid=r["uid"],
                sample=r["sample"],
                prompt_ids=r["prompt_ids"],
                response_ids=response or [tokenizer.eos_token_id],
                finish_reason=r["finish_reason"],
                reward=r["reward"],
            )
        )
    return canonical(samples)


def step_of(path: Path) -> int:
    return int(path.stem.split("_")[1])


def unseen_loss(
    critic: Critic, samples: list[Sample], rewards: list[torch.Tensor], algo: AlgorithmConfig
) -> float:
    """The value loss of the critic as it stands, before it learns from these samples. With one
    epoch and one mini-batch it is the logged `loss/value`; otherwise that averages the updates."""
    values = pad_sequence(critic.values(samples), batch_first=True)
    mask = pad_sequence([torch.ones(len(s.response_ids)) for s in samples], batch_first=True)
    _, returns = gae(pad_sequence(rewards, batch_first=True), values, mask, algo.gamma, algo.lam)
    loss = value_loss(values, values, returns, mask, algo.value_clip, algo.loss_agg, critic.norm_len)
    return float(loss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a PPO run directory (config.yaml, rollouts/)")
    parser.add_argument("--start", type=int, default=1, help="the first recorded step to replay")
    parser.add_argument("--steps", type=int, default=0, help="replay N steps from --start (0: all)")
    parser.add_argument("overrides", nargs="*", help="algorithm.key=value changes to the critic")
    args = parser.parse_intermixed_args()
    files = [f for f in sorted((args.run / "rollouts").glob("step_*.jsonl")) if step_of(f) >= args.start]
    if not files:
        sys.exit(f"{args.run}: no rollouts/step_*.jsonl files from step {args.start}")
    files = files[: args.steps or None]
    cfg = load_config(path=str(args.run / "config.yaml"), overrides=("algorithm.name=ppo", *args.overrides))
    if cfg.trainer.threads:
        torch.set_num_threads(cfg.trainer.threads)
    tokenizer = load_tokenizer(cfg.model)
    model = ValueModel.from_policy(load_model(cfg.model, len(tokenizer), cfg.seed))
    algo = cfg.algorithm
    critic = Critic(
        model,
        algo,
        cfg.optim,
        cfg.trainer.micro_batch_tokens,
        tokenizer.pad_token_id,
        seed=cfg.seed,
        norm_len=cfg.generation.max_new_tokens,
    )
    print(
        f"critic: epochs {algo.epochs}, mini_batches {algo.mini_batches}, lam {algo.lam}, "
        f"critic_lr {algo.critic_lr}, normalize_reward {algo.normalize_reward}"
    )
    print("step  unseen_loss  loss/value  explained_var  value/mean  seconds")
    rows = []
    for path in files:
        samples = read_step(path, tokenizer)
        t = time.perf_counter()
        rewards = token_rewards(samples, None, 0.0, algo.normalize_reward)
        unseen = unseen_loss(critic, samples, rewards, algo)
        _, metrics = critic.update(samples, rewards)
        step = step_of(path)
        rows.append(metrics | {"unseen": unseen, "step": step})
        print(
            f"{step:>4}  {unseen:11.5f}  {metrics['loss/value']:10.5f}"
            f"  {metrics['value/explained_variance']:13.3f}  {metrics['value/mean']:10.4f}"
            f"  {time.perf_counter() - t:7.1f}",
            flush=True,
        )
    for k in range(0, len(rows), 10):
        window = rows[k : k + 10]
        unseen = statistics.fmean(m["unseen"] for m in window)
        ev = statistics.fmean(m["value/explained_variance"] for m in window)
        steps = f"steps {window[0]['step']}-{window[-1]['step']}"
        print(f"{steps}: unseen loss {unseen:.5f}, explained variance {ev:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
