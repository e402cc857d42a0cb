"""Continuous-batching generation on a Hugging Face causal LM, with shared-prefix prefill.

One `step()` admits queued sequences (prefilling only the prompt tokens after their shared prefix,
once per prompt, and copying that KV to the prompt's samples), then runs one decode forward over
every running sequence. Finished sequences leave at once; their slots take the next queued or
resumed sequences. Sampling is counter-based (see `sampling.py`), so which batch a sequence runs
in, or on which engine it resumes after `cut()`, does not change its tokens.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from rlhfless.engine.forward import (
    SPAN_QUANTUM,
    attention_mask_kind,
    chunks,
    decode_forward,
    decode_span,
    prefill_forward,
)
from rlhfless.engine.graphs import StaticDecode, cuda_capture
from rlhfless.engine.kv import PrefixKV, SlotCache, StaleCacheError
from rlhfless.engine.packed import PackedLinears
from rlhfless.engine.prefixes import PrefixTree, prefill_levels
from rlhfless.engine.sampling import SamplingParams, sample_tokens, sequence_key, token_seed
from rlhfless.engine.sequences import (
    EngineStats,
    Progress,
    Request,
    SequenceResult,
    SequenceState,
)
from rlhfless.engine.weights import load_weights


@dataclass(eq=False)
class _Seq:
    uid: str
    sample: int
    prompt_ids: list[int]
    generated: list[int]
    logprobs: list[float]
    params: SamplingParams
    key: int
    length: int = 0  # tokens stored in this sequence's slot (the last sampled one is not yet fed)
    slot: int = -1
    finish: str | None = None

    @property
    def reserve(self) -> int:
        """KV tokens this sequence can come to hold."""
        return len(self.prompt_ids) + self.params.max_new_tokens


@dataclass(eq=False)
class _Row:
    """Tokens to prefill once for `seqs` (samples of one prompt), after an optional cached prefix."""

    tokens: list[int]
    prefix: PrefixKV | None
    seqs: list[_Seq]
    resumed: bool = False  # cut elsewhere: its prefill is resume work, not prompt work


class Engine:
    """Generation engine on one Hugging Face causal LM (Llama-style attention, SDPA or eager).

    `max_running` bounds concurrent sequences (slots); `max_kv_tokens` bounds the KV tokens they
    may come to hold (prompt + max_new_tokens each), so admission never has to preempt. A decode
    step attends over its longest sequence's span rounded up to `span_quantum` positions (the mask
    hides the rest), so steps repeat shapes: on a GPU, an attention backend that plans per shape
    (cuDNN's builds a graph) plans a few times a run, not once a token. `cuda_graphs` (a CUDA
    model only) replays each decode step as a CUDA graph of a fixed shape (`graphs.StaticDecode`);
    `static_decode` runs those fixed shapes eagerly, on any device. `packed_weights` (a float32
    model on a CPU) runs its forwards on linear weights reordered once per weight version
    (`packed.PackedLinears`). The model should have dropout off (eval mode, or dropout 0); the
    engine does not change its mode.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_ids: Iterable[int],
        pad_token_id: int,
        weight_version: int = 0,
        max_running: int = 64,
        max_kv_tokens: int = 1 << 16,
        prefill_chunk_tokens: int = 4096,
        span_quantum: int = SPAN_QUANTUM,
        static_decode: bool = False,
        cuda_graphs: bool = False,
        packed_weights: bool = False,
    ):
        if max_running < 1:
            raise ValueError(f"max_running: got {max_running}, expected >= 1")
        if max_kv_tokens < 1:
            raise ValueError(f"max_kv_tokens: got {max_kv_tokens}, expected >= 1")
        if span_quantum < 1:
            raise ValueError(f"span_quantum: got {span_quantum}, expected >= 1")
        self.model = model  # shared with a colocated learner: its train/eval mode is left alone
        self.mask_kind = attention_mask_kind(model)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.linears = PackedLinears(model, packed_weights)
        self._weight_version = weight_version
        self.max_running = max_running
        self.max_kv_tokens = max_kv_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.span_quantum = span_quantum
        self.device = next(model.parameters()).device
        self.slots = SlotCache.for_model(model)
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs: the model is on {self.device}, expected a CUDA device")
        capture = cuda_capture if cuda_graphs else None
        self.static = (
            StaticDecode(model, self.slots, self.mask_kind, max_running, capture)
            if static_decode or cuda_graphs
            else None
        )
        self.stats = EngineStats()
        self._queue: deque[_Row] = deque()
        self._running: list[_Seq] = []
        self._finished: list[SequenceResult] = []
        self._n_finished = 0
        self._n_added = 0

    @property
    def weight_version(self) -> int:
        """The version of the weights the model holds; a new one makes the reordered linear
        weights stale (a fused optimizer step on a shared model moves no version counter)."""
        return self._weight_version

    @weight_version.setter
    def weight_version(self, version: int) -> None:
        if version != self._weight_version:
            self.linears.stale()
        self._weight_version = version

    # ----- work in -------------------------------------------------------------------------

    def _check(self, kv: PrefixKV | None) -> None:
        if kv is not None and kv.weight_version != self.weight_version:
            raise StaleCacheError(
                f"prefix: got a KV cache of weight version {kv.weight_version}, "
                f"expected the engine's version {self.weight_version}"
            )

    def add(self, requests: Iterable[Request], params: SamplingParams, step: int) -> None:
        """Queue requests; their samples are keyed by (params.seed, step, uid, sample index)."""
        for req in requests:
            self._check(req.prefix)
            seqs = [
                _Seq(
                    req.uid,
                    s,
                    list(req.prompt_ids),
                    [],
                    [],
                    params,
                    sequence_key(params.seed, step, req.uid, s),
                )
                for s in req.sample_indices
            ]
            self._queue.append(_Row(list(req.prompt_ids), req.prefix, seqs))
            self._n_added += len(seqs)

    def resume(self, states: Iterable[SequenceState], params: SamplingParams, step: int) -> None:
        """Continue sequences cut elsewhere: re-prefill prompt + response, or start from `state.kv`."""
        for st in states:
            self._check(st.kv)
            tokens = list(st.prompt_ids) + list(st.generated_ids)
            if st.kv is not None and st.kv.token_ids != tokens[: len(st.kv)]:
                raise ValueError(f"kv: its tokens are not a prefix of uid {st.uid!r} sample {st.sample}")
            seq = _Seq(
                st.uid,
                st.sample,
                list(st.prompt_ids),
                list(st.generated_ids),
                list(st.logprobs),
                params,
                sequence_key(params.seed, step, st.uid, st.sample),
            )
            self._n_added += 1
            if self._finish_reason(seq) is not None:
                self._finish(seq)
            else:
                self._queue.append(_Row(tokens, st.kv, [seq], resumed=True))

    def prefill(
        self, prefixes: Sequence[Sequence[int]], parents: Sequence[int] | None = None
    ) -> list[PrefixKV]:
        """KV caches of `prefixes`, each computed once, tagged with the current weight version.

        With `parents` (`PrefixTree.parents`: an earlier prefix of each, or -1), a prefix's forward
        starts from its parent's KV and computes only its own tokens; forwards go level by level."""
        if any(len(p) == 0 for p in prefixes):
            raise ValueError("prefixes: got an empty prefix, expected >= 1 token each")
        parents = list(parents) if parents is not None else [-1] * len(prefixes)
        tree = PrefixTree([list(p) for p in prefixes], parents, {})  # each parent an earlier prefix
        start = time.perf_counter()
        with torch.inference_mode(), self.linears:
            out, computed = prefill_levels(
                self.model,
                tree,
                self.pad_token_id,
                self.mask_kind,
                self.prefill_chunk_tokens,
                self.weight_version,
            )
        self.stats.prompt_tokens_computed += computed
        self.stats.prefill_seconds += time.perf_counter() - start
        return out

    def set_weights(self, weights: dict[str, torch.Tensor] | torch.Tensor, version: int) -> None:
        """Load new policy weights (a state dict or one flat vector); older caches become stale."""
        if self._running or self._queue:
            raise RuntimeError("set_weights: sequences are still running; their KV would mix weight versions")
        load_weights(self.model, weights, in_place=self.static is not None and self.static.graphs)
        self.linears.stale()  # also where the version stays (a reference's weights, say)
        self.weight_version = version

    # ----- running -------------------------------------------------------------------------

    def progress(self) -> Progress:
        return Progress(
            finished=self._n_finished,
            total=self._n_added,
            running=len(self._running),
            queued=sum(len(row.seqs) for row in self._queue),
            free_slots=self.max_running - len(self._running),
        )

    def step(self) -> None:
        """Admit what fits, then one decode iteration of the running batch."""
        with torch.inference_mode():
            self._admit()
            if self._running:
                self._decode()

    def run(self, until: Callable[[Progress], bool] | None = None) -> list[SequenceResult]:
        """Step until all work is done or `until(progress)` holds; returns (and hands over) finished results."""
        while self._running or self._queue:
            if until is not None and until(self.progress()):
                break
            self.step()
        return self.take_finished()

    def take_finished(self) -> list[SequenceResult]:
        done, self._finished = self._finished, []
        return done

    def generate(
        self, requests: Sequence[Request], params: SamplingParams, step: int
    ) -> list[SequenceResult]:
        """Run `requests` to completion; results in request order, then sample order."""
        self.add(requests, params, step)
        pairs = [(req.uid, s) for req in requests for s in req.sample_indices]
        order = {pair: i for i, pair in enumerate(pairs)}
        done = self.run()
        mine = [r for r in done if (r.uid, r.sample) in order]
        self._finished = [r for r in done if (r.uid, r.sample) not in order]
        return sorted(mine, key=lambda r: order[(r.uid, r.sample)])

    def unfinished(self, with_kv: bool = False) -> list[SequenceState]:
        """States of the running, then queued, sequences, leaving them in the engine."""

        def state(seq: _Seq, kv: PrefixKV | None) -> SequenceState:
            return SequenceState(
                seq.uid, seq.sample, seq.prompt_ids, list(seq.generated), list(seq.logprobs), kv
            )

        running = [state(seq, self._slot_kv(seq) if with_kv else None) for seq in self._running]
        return running + [state(seq, row.prefix) for row in self._queue for seq in row.seqs]

    def _slot_kv(self, seq: _Seq) -> PrefixKV:
        """A running sequence's KV, copied out of its slot."""
        keys, values = self.slots.read(seq.slot, seq.length)
        tokens = (seq.prompt_ids + seq.generated)[: seq.length]
        return PrefixKV(tokens, keys, values, self.weight_version)

    def cut(self, with_kv: bool = False) -> list[SequenceState]:
        """Remove and return every unfinished sequence (running and queued) for `resume` elsewhere."""
        states = self.unfinished(with_kv)
        self._running, self._queue = [], deque()
        return states

    def snapshot_stats(self) -> EngineStats:
        return replace(self.stats)

    # ----- internals -----------------------------------------------------------------------

    def _admit(self) -> None:
        free = self.max_running - len(self._running)
        kv_used = sum(s.reserve for s in self._running)
        admitted: list[_Row] = []
        while self._queue and free > 0:
            row = self._queue[0]
            take = 0
            for seq in row.seqs[:free]:
                if kv_used + seq.reserve > self.max_kv_tokens and (self._running or admitted or take):
                    break
                kv_used += seq.reserve
                take += 1
            if take == 0:
                break
            if take < len(row.seqs):
                admitted.append(replace(row, seqs=row.seqs[:take]))
                row.seqs = row.seqs[take:]
            else:
                admitted.append(self._queue.popleft())
            free -= take
        if not admitted:
            return
        start = time.perf_counter()
        for row in admitted:
            # At least the last prompt token is computed: its logits give the first response token.
            if row.prefix is not None and len(row.prefix) >= len(row.tokens):
                row.prefix = row.prefix.truncated(len(row.tokens) - 1)
            if row.prefix is not None and not len(row.prefix):
                row.prefix = None
        for chunk in chunks(
            admitted,
            lambda row: len(row.tokens) - (len(row.prefix) if row.prefix else 0),
            self.prefill_chunk_tokens,
        ):
            self._prefill_rows(chunk)
        self.stats.prefill_seconds += time.perf_counter() - start

    def _prefill_rows(self, rows: list[_Row]) -> None:
        with self.linears:
            logits, cache, span = prefill_forward(
                self.model, [(row.tokens, row.prefix) for row in rows], self.pad_token_id, self.mask_kind
            )
        n_new = len(self._running) + sum(len(row.seqs) for row in rows)
        # fixed shapes: room for every joiner's whole response now, so the capacity (a graph's
        # span) stays put while they decode
        room = (
            seq.reserve if self.static is not None else len(row.tokens) + 1
            for row in rows
            for seq in row.seqs
        )
        self.slots.reserve(n_new, max(room))
        joined: list[_Seq] = []
        row_of: list[int] = []
        for r, row in enumerate(rows):
            p = len(row.prefix) if row.prefix is not None else 0
            s = len(row.tokens) - p
            new_keys = [k[r, :, span - s :] for k in cache.new_keys]
            new_values = [v[r, :, span - s :] for v in cache.new_values]
            for seq in row.seqs:
                seq.slot = len(self._running)
                seq.length = len(row.tokens)
                if p:
                    self.slots.write(seq.slot, row.prefix.keys, row.prefix.values)
                self.slots.write(seq.slot, new_keys, new_values, start=p)
                self._running.append(seq)
                joined.append(seq)
                row_of.append(r)
            if row.resumed:
                self.stats.resume_tokens_computed += s
            else:
                self.stats.prompt_tokens_computed += s
                self.stats.prompt_tokens_naive += len(row.tokens) * len(row.seqs)
        self._sample(joined, logits[torch.tensor(row_of, device=logits.device)])
        self._retire()

    def _decode(self) -> None:
        start = time.perf_counter()
        running = self._running
        lengths = [s.length for s in running]
        span = decode_span(max(lengths), self.span_quantum)
        positions = torch.tensor(lengths, dtype=torch.long, device=self.device)
        tokens = torch.tensor([s.generated[-1] for s in running], dtype=torch.long, device=self.device)
        with self.linears:
            if self.static is not None:
                logits = self.static(tokens, positions, span)
            else:
                self.slots.reserve(len(running), span)
                logits = decode_forward(self.model, self.slots, tokens, positions, self.mask_kind, span)
        for seq in running:
            seq.length += 1
        self._sample(running, logits)
        self._retire()
        self.stats.decode_steps += 1
        self.stats.decode_seconds += time.perf_counter() - start

    def _sample(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """Draw each sequence's next token from its own counter-based key."""
        groups: dict[SamplingParams, list[int]] = {}
        for i, seq in enumerate(seqs):
            groups.setdefault(seq.params, []).append(i)
        for params, idx in groups.items():
            seeds = [token_seed(seqs[i].key, len(seqs[i].generated)) for i in idx]
            rows = logits if len(idx) == len(seqs) else logits[torch.tensor(idx, device=logits.device)]
            tokens, logprobs = sample_tokens(rows, params, seeds)
            for i, token, logprob in zip(idx, tokens.tolist(), logprobs.tolist(), strict=True):
                seq = seqs[i]
                seq.generated.append(token)
                seq.logprobs.append(logprob)
                seq.finish = self._finish_reason(seq)
        self.stats.tokens_generated += len(seqs)

    def _finish_reason(self, seq: _Seq) -> str | None:
        if seq.generated and seq.generated[-1] in self.eos_token_ids:
            return "stop"
        if len(seq.generated) >= seq.params.max_new_tokens:
            return "length"
        return None

    def _finish(self, seq: _Seq) -> None:
        seq.finish = seq.finish or self._finish_reason(seq)
        self._finished.append(
            SequenceResult(seq.uid, seq.sample, seq.prompt_ids, seq.generated, seq.logprobs, seq.finish)
        )
        self._n_finished += 1

    def _retire(self) -> None:
        """Drop finished sequences and fill their slots with sequences from the tail."""
        if not any(seq.finish for seq in self._running):
            return
        alive = []
        for seq in self._running:
            if seq.finish:
                self._finish(seq)
            else:
                alive.append(seq)
        n = len(alive)
        holes = sorted(seq.slot for seq in self._running if seq.finish and seq.slot < n)
        movers = [seq for seq in alive if seq.slot >= n]
        for seq, hole in zip(movers, holes, strict=True):
            self.slots.move(seq.slot, hole, seq.length)
            seq.slot = hole
        self._running = sorted(alive, key=lambda seq: seq.slot)
