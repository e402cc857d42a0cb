"""Do a run's ground-truth answers rank its prompts' response lengths? Replays a finished run.

Feeds each step's groups (`rollouts/step_*.jsonl`) with their prompts' answers (the run's own data
config, tokenized by the trainer's own helpers) through a fresh length predictor, and prints, after each
step, per data source the answer ratio's and the source's one length's relative errors on the
groups so far, and whether answers would stand in for unseen prompts (`planner/source_lengths.py`:
within 25%, and at most half the one length's error, on at least 3 groups).

With `--pilot FILE` (the run's length pilot, `~/.cache/rlhfless/profiles/pilot-*.json`) its groups
come first, as in the run, and each step also prints the decode tokens the predictor forecast for
it against those its samples took.

    .venv/bin/python benchmarks/answer_fit.py RUN_DIR [--pilot FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlhfless.config import load_config
from rlhfless.data.sources import load_prompts
from rlhfless.models import load_tokenizer
from rlhfless.planner.predictor import LengthPredictor
from rlhfless.runtime.trainer import answer_lengths, tokenize_prompts


def predict(predictor: LengthPredictor, uids: list[str], step: list, tokenizer):
    """The predictor's (group max, mean) for `uids`, told their prompts' answers and sources as the
    run's plans tell it."""
    return predictor.predict(uids, answer_lengths(step, tokenizer), [p.prompt.data_source for p in step])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run's directory")
    parser.add_argument("--pilot", type=Path, help="the run's length pilot (its cached lengths)")
    args = parser.parse_args()
    cfg = load_config(str(args.run / "config.yaml"))
    prompts = {p.uid: p for p in load_prompts(cfg.data)}
    tokenizer = load_tokenizer(cfg.model)
    predictor = LengthPredictor.from_config(cfg.scheduler)
    if args.pilot:  # its uids are `pilot:<uid>`, as the run gave them
        lengths = json.loads(args.pilot.read_text())["lengths"]
        step = tokenize_prompts(
            [prompts[u.split(":", 1)[1]] for u in lengths], tokenizer, cfg.generation.max_prompt_tokens
        )
        predict(predictor, list(lengths), step, tokenizer)
        predictor.update_many(list(lengths), list(lengths.values()))
    for path in sorted((args.run / "rollouts").glob("step_*.jsonl")):
        groups: dict[str, list[int]] = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            groups.setdefault(row["uid"], []).append(int(row["response_tokens"]))
        step = tokenize_prompts([prompts[u] for u in groups], tokenizer, cfg.generation.max_prompt_tokens)
        uids = [p.uid for p in step]
        _, mean = predict(predictor, uids, step, tokenizer)
        took = sum(map(sum, groups.values()))
        cap = cfg.generation.max_new_tokens  # as the runtime caps its predictions
        forecast = sum(min(m, cap) for m in mean.tolist()) * cfg.algorithm.group_size
        print(f"{path.stem}  decode tokens forecast {forecast:.0f}, took {took} ({forecast / took - 1:+.1%})")
        predictor.update_many(uids, [groups[u] for u in uids], cfg.generation.max_new_tokens)
        for source, (answer, flat) in sorted(predictor.sources.answer_errors().items()):
            fits = "stands in" if predictor.sources.answers_fit(source) else "no"
            print(f"{path.stem}  {source:40s} answer {answer:6.1%}  one length {flat:6.1%}  {fits}")


if __name__ == "__main__":
    main()
