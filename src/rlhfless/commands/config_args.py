"""A command's config from its arguments: one YAML path or `--preset NAME`, then dotted overrides.

`rlhfless train` and `rlhfless plan --run` take them alike, so that a line that trains also
forecasts with `train` changed to `plan --run`."""

from __future__ import annotations

from pathlib import Path

from rlhfless.config import PRESETS, ConfigError


def split_config(items: list[str], preset: str | None) -> tuple[str | None, str | None, list[str]]:
    """(config path, preset, overrides) from positional `items` and `--preset`: an item with '='
    is an override, else the config file; a preset's name that is no file is that preset (as
    `plan --run tiny` has always read). Neither given: the default preset."""
    paths = [i for i in items if "=" not in i]
    if len(paths) > 1:
        raise ConfigError(f"config error: more than one config file given: {', '.join(paths)}")
    if paths and preset:
        raise ConfigError("config error: give a config file or --preset, not both")
    path = paths[0] if paths else None
    if path in PRESETS and not Path(path).exists():
        path, preset = None, path
    return path, preset, [i for i in items if "=" in i]
