"""`rlhfless simulate`: the planner on a modelled cluster; the paper's experiments as presets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlhfless.inputs import check_writable, read_mapping
from rlhfless.typed import render


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("simulate", help="simulate training steps on a modelled cluster")
    parser.add_argument(
        "config", nargs="?", help="YAML/JSON file with cluster/model/workload/training/scheduler"
    )
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="e.g. cluster.nodes=4")
    parser.add_argument("--preset", help="paper-physical or paper-sim")
    parser.add_argument("--output", type=Path, help="output directory (default sim_out/<preset or config>)")
    parser.add_argument(
        "--no-sweeps", action="store_true", help="skip the sensitivity sweeps and scalability"
    )
    parser.add_argument(
        "--show-config",
        action="store_true",
        help="print each scenario's resolved config as YAML, every key under its help text, and exit",
    )


def run(args: argparse.Namespace) -> int:
    from rlhfless.sim.report import configs_of, simulate

    items = list(args.overrides)
    config = args.config
    if config and "=" in config:  # `rlhfless simulate key=value ...` without a config file
        items.insert(0, config)
        config = None
    try:
        if args.preset and config:
            raise ValueError(f"config: got {config!r} with --preset {args.preset}, expected one of them")
        if args.preset:
            from rlhfless.sim.presets import preset

            scenarios = preset(args.preset)
            name = args.preset
        elif config:
            tree = read_mapping(Path(config), "a simulator config (cluster, model, workload, ...)")
            scenarios = [(Path(config).stem, tree)]
            name = Path(config).stem
        else:
            scenarios = [("default", {})]
            name = "default"
        if args.show_config:
            shown = [
                f"# scenario {scenario}\n{render(cfg)}" for scenario, cfg in configs_of(scenarios, items)
            ]
            print("---\n".join(shown), end="")
            return 0
        output = args.output or Path("sim_out") / name
        check_writable(output, "--output")
        table = simulate(name, scenarios, items, output, sweeps=not args.no_sweeps)
    except (ValueError, OSError) as err:
        print(f"rlhfless simulate: {err}", file=sys.stderr)
        return 2
    print(table)
    print(f"\nwrote {output}/summary.json, steps.jsonl and figures")
    return 0
