"""Time table of one decode actor: how long prefill and one decode step take.

The planner never runs a model; it reads these tables. They come either from measurement with dummy
batches (the engine's `rlhfless profile`) or from a roofline model of the model shape and the GPU
(`planner.hardware`). Both produce the same JSON:

    {"decode": [{"batch": B, "context": C, "ms": M}, ...],
     "prefill": [{"tokens": N, "ms": M}, ...],
     "gpus": 1, "max_kv_tokens": K, "max_batch": B (optional), "prefill_chunk": C (optional)}

Decode points must cover a full grid (every batch size with every context length). Lookups are
vectorised: linear interpolation inside the table, the first row/column below it (launch cost does
not shrink for tiny inputs), and linear extrapolation from the last segment above it (attention
grows linearly with context, so a straight line is the honest guess). Prefill of more tokens than
one chunk runs chunk by chunk (as vLLM's chunked prefill does), so it never leaves the table.

How many sequences an actor decodes at once is bounded by its KV memory (each sequence counted at
its final length) and by the engine's batch limit (`max_batch`, vLLM's max_num_seqs): the planner's
time model and the simulator both read `concurrency`, so they agree.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from rlhfless.files import write_atomic


def _cell(grid: np.ndarray, x: np.ndarray, cells: _Cells) -> tuple[np.ndarray, np.ndarray]:
    """Grid cell of each x and its offset from the cell's low point: 0 below the grid (clamped),
    past the last point the last cell goes on (linear extrapolation). `cells`: `grid`'s."""
    if grid.size == 1:
        return np.zeros(x.shape, dtype=np.intp), np.zeros(x.shape)
    cell = cells(x)
    return cell, np.maximum(x - grid[cell], 0.0)


def _scalar_cell(grid: list[float], x: float) -> tuple[int, float]:
    """`_cell` of one x."""
    if len(grid) == 1:
        return 0, 0.0
    cell = bisect.bisect_right(grid, x, 1, len(grid) - 1) - 1
    return cell, max(x - grid[cell], 0.0)


BUCKETS = 1 << 16  # most buckets a `_Cells` table holds (a grid needing more is searched)


class _Cells:
    """`np.searchsorted(grid[1:-1], x, side="right")` for many x at once, without a binary
    search per x: the range of the inner points is cut into buckets an eighth of their smallest
    gap wide. A rounding can put x at most one bucket off, so the three buckets around the one
    it lands in, well under a gap wide, hold x and at most one point: per bucket, a table gives
    the count of points below those three and the point among them (NaN: none), and one
    comparison with it makes the count exact."""

    def __init__(self, grid: np.ndarray) -> None:
        inner = grid[1:-1]
        self.inner = inner
        self.below: np.ndarray | None = None
        # Buckets far wider than a rounding of the grid's values, and not too many of them.
        if inner.size < 2 or np.diff(inner).min() <= 1e-9 * np.abs(inner).max():
            return
        with np.errstate(over="ignore"):  # a tiny gap: more buckets than any table holds
            self.scale = 8.0 / np.diff(inner).min()
            if not (inner[-1] - inner[0]) * self.scale <= BUCKETS:
                return
        # x lands in bucket floor(x * scale + shift): 3 + its place, in buckets, past inner[0].
        self.shift = 3.0 - inner[0] * self.scale
        place = (inner - inner[0]) * self.scale
        self.buckets = int(np.ceil(place[-1])) + 5  # what lands in the last is past every point
        lands = np.arange(self.buckets + 1.0)  # x in bucket j is within [j - 4, j - 1) in place
        self.below = np.searchsorted(place, lands - 4.0)
        near = np.searchsorted(place, lands - 1.0) > self.below
        self.point = np.where(near, inner[np.minimum(self.below, inner.size - 1)], np.nan)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.below is None or x.ndim == 0:  # no table, or one x
            return np.searchsorted(self.inner, x, side="right")
        at = np.multiply(x, self.scale)
        at += self.shift
        np.fmax(at, 0.0, out=at)  # fmax and fmin take the number over NaN: NaN and inf land
        np.fmin(at, self.buckets, out=at)  # in an end bucket, and no cast warns
        bucket = at.astype(np.intp)
        count = self.below.take(bucket, mode="clip")
        count += x >= self.point.take(bucket, mode="clip")  # x >= NaN: never
        return count


def _require_sorted_unique(values: np.ndarray, what: str) -> None:
    if values.size == 0:
        raise ValueError(f"{what}: got no points, expected at least one")
    if np.any(np.diff(values) <= 0):
        raise ValueError(f"{what}: got duplicate values, expected distinct values")
    if values[0] < 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"{what}: got {values[0]}, expected finite non-negative values")


@dataclass
class Profile:
    """Prefill and decode-step times of one actor holding `gpus` GPUs."""

    prefill_tokens: np.ndarray
    prefill_ms: np.ndarray
    decode_batch: np.ndarray
    decode_context: np.ndarray
    decode_ms: np.ndarray  # shape (len(decode_batch), len(decode_context))
    gpus: int = 1
    max_kv_tokens: int = 1 << 20
    cold_start_s: float = 0.0
    note: str = field(default="")
    max_batch: int = 0  # most sequences decoded at once; 0 = only KV memory limits it
    prefill_chunk: int = 0  # tokens prefilled per forward; 0 = the largest profiled token count

    def __post_init__(self) -> None:
        self.prefill_tokens = np.asarray(self.prefill_tokens, dtype=float)
        self.prefill_ms = np.asarray(self.prefill_ms, dtype=float)
        self.decode_batch = np.asarray(self.decode_batch, dtype=float)
        self.decode_context = np.asarray(self.decode_context, dtype=float)
        self.decode_ms = np.asarray(self.decode_ms, dtype=float)
        _require_sorted_unique(self.prefill_tokens, "prefill.tokens")
        _require_sorted_unique(self.decode_batch, "decode.batch")
        _require_sorted_unique(self.decode_context, "decode.context")
        if self.prefill_ms.shape != self.prefill_tokens.shape:
            raise ValueError("prefill: got mismatched tokens/ms, expected one ms per token count")
        shape = (self.decode_batch.size, self.decode_context.size)
        if self.decode_ms.shape != shape:
            raise ValueError(f"decode: got ms of shape {self.decode_ms.shape}, expected a full grid {shape}")
        for name, arr in (("prefill.ms", self.prefill_ms), ("decode.ms", self.decode_ms)):
            if np.any(arr < 0) or not np.all(np.isfinite(arr)):
                raise ValueError(f"{name}: got {arr.min()}, expected finite non-negative milliseconds")
        if self.gpus < 1:
            raise ValueError(f"gpus: got {self.gpus}, expected an integer >= 1")
        if self.max_kv_tokens < 1:
            raise ValueError(f"max_kv_tokens: got {self.max_kv_tokens}, expected an integer >= 1")
        if self.cold_start_s < 0:
            raise ValueError(f"cold_start_s: got {self.cold_start_s}, expected a number >= 0")
        for name in ("max_batch", "prefill_chunk"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"{name}: got {getattr(self, name)}, expected an integer >= 0 (0 = no limit)"
                )

    @property
    def chunk(self) -> float:
        return float(self.prefill_chunk or self.prefill_tokens[-1])

    def _prefill_ms(self, x: np.ndarray) -> np.ndarray:
        cell, offset = _cell(self.prefill_tokens, x, self._cells[2])
        return np.maximum(self.prefill_ms[cell] + offset * self._prefill_slope[cell], 0.0)

    @cached_property
    def _prefill_slope(self) -> np.ndarray:
        """ms per token between neighbouring prefill points (0 for a one-point table)."""
        if self.prefill_ms.size == 1:
            return np.zeros(1)
        return np.diff(self.prefill_ms) / np.diff(self.prefill_tokens)

    def prefill_seconds(self, tokens: Any) -> np.ndarray:
        """Seconds to prefill `tokens` prompt tokens, chunk by chunk (0 for no tokens)."""
        x = np.maximum(np.asarray(tokens, dtype=float), 0.0)
        chunk = self.chunk
        full = np.floor(x / chunk)
        rest = x - full * chunk
        ms = full * self._prefill_ms(np.array(chunk)) + np.where(rest > 0, self._prefill_ms(rest), 0.0)
        return ms / 1e3

    def concurrency(self, mean_sequence_tokens: Any) -> np.ndarray:
        """Sequences decoded at once when each holds `mean_sequence_tokens` of KV at its end (>= 1)."""
        tokens = np.maximum(np.asarray(mean_sequence_tokens, dtype=float), 1.0)
        cap = np.maximum(1.0, np.floor(self.max_kv_tokens / tokens))
        return np.minimum(cap, self.max_batch) if self.max_batch else cap

    def decode_step_seconds(self, batch: Any, context: Any) -> np.ndarray:
        """Seconds for one decode step of `batch` sequences of mean length `context` (broadcasts)."""
        b, c = np.asarray(batch, dtype=float), np.asarray(context, dtype=float)
        if b.shape != c.shape:
            b, c = np.broadcast_arrays(b, c)
        shape, b, c = b.shape, b.ravel(), c.ravel()
        bi, db = _cell(self.decode_batch, b, self._cells[0])
        ci, dc = _cell(self.decode_context, c, self._cells[1])
        k = bi * max(self.decode_context.size - 1, 1)
        k += ci
        base, along_c, along_b, cross = self._bilinear
        # base + dc * along_c + db * (along_b + dc * cross), in place (same roundings)
        rise = cross.take(k)
        rise *= dc
        rise += along_b.take(k)
        rise *= db
        ms = along_c.take(k)
        ms *= dc
        ms += base.take(k)
        ms += rise
        np.maximum(ms, 0.0, out=ms)
        ms[~(b > 0)] = 0.0
        ms /= 1e3
        return ms.reshape(shape)[()]

    def step_seconds(self, batch: float, context: float) -> float:
        """`decode_step_seconds` of one batch and context, without numpy's cost per call: the
        gain rule (`planner.migration`) looks up thousands of single steps per decision. The
        same arithmetic in the same order, so the same float."""
        b, c = float(batch), float(context)
        base, along_c, along_b, cross = self._bilinear_lists
        bi, db = _scalar_cell(self._grid_lists[0], b)
        ci, dc = _scalar_cell(self._grid_lists[1], c)
        k = bi * max(len(self._grid_lists[1]) - 1, 1) + ci
        ms = max(along_c[k] * dc + base[k] + (cross[k] * dc + along_b[k]) * db, 0.0)
        return ms / 1e3 if b > 0 else 0.0

    @cached_property
    def _grid_lists(self) -> tuple[list[float], list[float]]:
        return self.decode_batch.tolist(), self.decode_context.tolist()

    @cached_property
    def _bilinear_lists(self) -> tuple[list[float], ...]:
        return tuple(t.tolist() for t in self._bilinear)

    @cached_property
    def _cells(self) -> tuple[_Cells, _Cells, _Cells]:
        """Cell finders of the decode batch, decode context and prefill token grids."""
        return _Cells(self.decode_batch), _Cells(self.decode_context), _Cells(self.prefill_tokens)

    @cached_property
    def _bilinear(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per grid cell (flattened): the value at its low corner, the slopes along context and
        along batch, and the cross term, so that one lookup is four gathers."""
        v, gb, gc = self.decode_ms, self.decode_batch, self.decode_context
        step_b = np.diff(gb)[:, None] if gb.size > 1 else np.ones((1, 1))
        step_c = np.diff(gc)[None, :] if gc.size > 1 else np.ones((1, 1))
        along_b = np.diff(v, axis=0) / step_b if gb.size > 1 else np.zeros((1, gc.size))
        along_c = np.diff(v, axis=1) / step_c if gc.size > 1 else np.zeros((gb.size, 1))
        cells_b, cells_c = along_b.shape[0], along_c.shape[1]
        cross = np.diff(along_c, axis=0) / step_b if gb.size > 1 else np.zeros((1, cells_c))
        return tuple(
            np.ascontiguousarray(t).ravel()
            for t in (v[:cells_b, :cells_c], along_c[:cells_b], along_b[:, :cells_c], cross)
        )

    def to_dict(self) -> dict[str, Any]:
        decode = [
            {"batch": int(b), "context": int(c), "ms": float(self.decode_ms[i, j])}
            for i, b in enumerate(self.decode_batch)
            for j, c in enumerate(self.decode_context)
        ]
        prefill = [
            {"tokens": int(n), "ms": float(ms)}
            for n, ms in zip(self.prefill_tokens, self.prefill_ms, strict=True)
        ]
        out: dict[str, Any] = {
            "decode": decode,
            "prefill": prefill,
            "gpus": int(self.gpus),
            "max_kv_tokens": int(self.max_kv_tokens),
        }
        if self.cold_start_s:
            out["cold_start_s"] = float(self.cold_start_s)
        if self.note:
            out["note"] = self.note
        if self.max_batch:
            out["max_batch"] = int(self.max_batch)
        if self.prefill_chunk:
            out["prefill_chunk"] = int(self.prefill_chunk)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        """Build from the JSON layout above; raises ValueError naming the bad field."""
        for key in ("decode", "prefill", "gpus", "max_kv_tokens"):
            if key not in data:
                raise ValueError(f"{key}: missing, expected it in the profile")
        for key in ("gpus", "max_kv_tokens"):
            if isinstance(data[key], bool) or not isinstance(data[key], int):
                raise ValueError(f"{key}: got {data[key]!r}, expected an integer >= 1")
        try:
            prefill = sorted((float(p["tokens"]), float(p["ms"])) for p in data["prefill"])
            decode = [(float(p["batch"]), float(p["context"]), float(p["ms"])) for p in data["decode"]]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"profile points: got a malformed point ({err}), expected numbers") from err
        batches = np.unique([d[0] for d in decode])
        contexts = np.unique([d[1] for d in decode])
        grid = np.full((batches.size, contexts.size), np.nan)
        if len({(b, c) for b, c, _ in decode}) < len(decode):
            raise ValueError("decode: got a (batch, context) point twice, expected each point once")
        for b, c, ms in decode:
            grid[np.searchsorted(batches, b), np.searchsorted(contexts, c)] = ms
        if np.isnan(grid).any():
            raise ValueError(
                f"decode: got {len(decode)} points, expected a full grid of "
                f"{batches.size} batch sizes x {contexts.size} context lengths"
            )
        return cls(
            prefill_tokens=np.array([p[0] for p in prefill]),
            prefill_ms=np.array([p[1] for p in prefill]),
            decode_batch=batches,
            decode_context=contexts,
            decode_ms=grid,
            gpus=int(data["gpus"]),
            max_kv_tokens=int(data["max_kv_tokens"]),
            cold_start_s=float(data.get("cold_start_s", 0.0)),
            note=str(data.get("note", "")),
            max_batch=int(data.get("max_batch", 0)),
            prefill_chunk=int(data.get("prefill_chunk", 0)),
        )

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a saved table; every refusal is an InputError naming the file (read_json's checks)."""
        from rlhfless.inputs import InputError, read_json

        data = read_json(Path(path), "a profile table (rlhfless profile --json)")
        try:
            return cls.from_dict(data)
        except ValueError as err:
            raise InputError(f"{path}: {err}") from None

    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=1) + "\n")
