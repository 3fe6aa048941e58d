"""The MLX engine: a Hugging Face safetensors directory served on MLX, many replies per forward pass.

mlx-lm builds the model for the directory's `model_type`; kinfer supplies the caches (kv.PagedKV
for attention, state.StateView for recurrent layers) and its own step loop:

- every generating row advances in one decode pass; waiting prompts are prefilled in chunks (a token
  budget per step, prefill_budget.py) in separate passes of the same step, so running replies never
  stall for long; the chunks of many prompts share a pass, right-padded to one length (a recurrent
  layer's state stops at each row's own end: rows.plan_prefill, state.StateView), since every pass
  costs the host a whole forward pass;
- sampling happens on the device for all rows at once (sampling.py), and step n+1 is dispatched
  (`mx.async_eval`) before the host reads step n's tokens;
- a finished row's slot is taken by the next job in place; other rows are untouched;
- each row's attention reads only its own KV blocks;
- a prefix pool keeps recent prompts' KV blocks (and exact recurrent-state checkpoints).

Everything runs on the thread that built the engine (the scheduler's engine thread).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from kinfer.constrain.runtime import GrammarVocab, MaskTable
from kinfer.distributed.agree import agree_tokens
from kinfer.engines.base import EngineStats, GenerationJob, JobUpdate, ModelInfo
from kinfer.engines.logprobs import check_bias_ids
from kinfer.engines.mlx import blas, fuse, kernels, shape_buckets
from kinfer.engines.mlx.block_allocator import BlockAllocator
from kinfer.engines.mlx.caches import cache_arrays, pass_views
from kinfer.engines.mlx.check import self_check_engine
from kinfer.engines.mlx.compiled_layers import compile_decode
from kinfer.engines.mlx.constrained_rows import ConstrainedRows
from kinfer.engines.mlx.decode_pass import DecodePass
from kinfer.engines.mlx.embed import embed_generative, generative_spec
from kinfer.engines.mlx.gated_delta import install_gated_delta_hook, kinfer_pass
from kinfer.engines.mlx.hybrid_layers import HybridLayers
from kinfer.engines.mlx.kv import PagedLayer, PassLayout, install_attention_hook
from kinfer.engines.mlx.memory import PeakWindow, device_budget, mlx_account, over_budget, weight_bytes
from kinfer.engines.mlx.model import load_weights, model_vocab, read_model_directory
from kinfer.engines.mlx.prefix import PrefixPool
from kinfer.engines.mlx.prompt_passes import PromptPasses, SplitChunk
from kinfer.engines.mlx.row_blocks import RowBlocks
from kinfer.engines.mlx.rows import Inflight, Row, StepBatch, check_prompt, plan_prefill
from kinfer.engines.mlx.sampling import needs_penalties
from kinfer.engines.mlx.sdpa_buckets import LONG_CONTEXT_QUERIES
from kinfer.engines.mlx.sizing import SizePlan, plan_layers, plan_size
from kinfer.engines.mlx.state import StateSlots, reset_row
from kinfer.engines.mlx.step_timer import NO_TIMER, NoTimer
from kinfer.engines.mlx.tokenizer import MlxTokenizer
from kinfer.engines.mlx.warm_up import warm_shapes
from kinfer.engines.mlx.warm_up import warm_up as run_warm_up
from kinfer.engines.prefill_budget import PrefillBudget, StepClock
from kinfer.errors import Busy, EngineFailure, InvalidRequest

log = logging.getLogger(__name__)


class MlxEngine(RowBlocks, ConstrainedRows, PromptPasses, DecodePass):
    """A model directory served by MLX (the `Engine` protocol).

    rows / ctx: 0 = automatic (sizing.plan_size). prefix_cache: keep recent prompts for reuse. cache_limit_gb:
    cap on MLX's buffer cache. prefill_chunk: prompt tokens per step (0 = automatic). step_budget_ms: the step
    time prompt chunks fit in while rows decode (0: automatic; prefill_budget.py). self_check: compare
    kinfer's caches with mlx-lm's forward pass at load. Diagnostic switches, each falling back to a portable
    path when off: fused_decode (CUDA: the fused paged decode-attention kernel), gated_delta (CUDA: the
    GatedDeltaNet recurrence kernel), fuse_projections (q/k/v and gate/up as one matrix product each; None =
    only on a GPU), precompiled_kernels (CUDA: those kernels compiled once and launched precompiled; off: it
    did not pay on the H200), compiled_step (compiled decode passes: compiled_step.py, compiled_layers.py),
    layer_split (CUDA: a prompt's chunks beside decoding rows a few layers a step: prompt_passes.py).
    `step_timer`: where each step's host time goes (step_timer.py; the bench installs one). warm_up (CUDA):
    run the pass shapes serving meets first once at load (warm_up.py). group: serve this
    rank's tensor-parallel shard (kinfer/distributed/: every rank runs the same steps; no embedding path);
    size: rows, context and pool decided elsewhere (by a distributed rank 0, so every rank sizes alike).
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        rows: int = 0,
        ctx: int = 0,
        prefix_cache: bool = True,
        cache_limit_gb: float = 4.0,
        prefill_chunk: int = 0,
        step_budget_ms: float = 0.0,
        self_check: bool = True,
        fused_decode: bool = True,
        gated_delta: bool = True,
        fuse_projections: bool | None = None,
        precompiled_kernels: bool = False,
        compiled_step: bool = True,
        layer_split: bool = True,
        warm_up: bool = True,
        min_ctx: int = 0,
        memory_budget_gb: float = 0.0,
        group: mx.distributed.Group | None = None,
        size: SizePlan | None = None,
    ) -> None:
        path = Path(path)
        mx.set_cache_limit(int(cache_limit_gb * (1 << 30)))
        gpu = mx.default_device() == mx.gpu
        log.info("MLX device: %s (BLAS preload: %s)", mx.default_device(), blas.preloaded or "none")

        self._tokenizer = MlxTokenizer(path)
        directory = read_model_directory(path, self._tokenizer.config, self._tokenizer.eos_id)
        self._model = load_weights(path, group)
        # a sharded model: every rank takes rank 0's tokens (distributed/agree.py), so their rows never drift
        self._agree = None if group is None else agree_tokens(group)
        if fuse_projections is None:
            # on a GPU the host-side cost of each matrix product dominates small batches (fuse.py)
            fuse_projections = gpu
        if fuse_projections:
            log.debug("fused %d projection groups", fuse.fuse_projections(self._model))
        compiled = compiled_step and group is None  # a shard's projections hold collectives
        self._decoder = compile_decode(self._model, directory.model_type) if compiled else None
        self._layer_split = layer_split and group is None  # a shard's passes hold collectives
        # a hybrid model's chunks a few layers a step (prompt_passes.py), where no compiled decoder runs
        self._hybrid = HybridLayers.wrap(self._model, directory.model_type)
        install_attention_hook()
        install_gated_delta_hook()
        from mlx_lm.utils import maybe_set_recommended_wired_limit

        # Metal: keep the weights wired (as mlx-lm's generators do); no-op elsewhere
        self._old_wired_limit = maybe_set_recommended_wired_limit()
        self._layers = plan_layers(self._model, directory.model_type)
        self._paged = [layer for layer in self._layers if isinstance(layer, PagedLayer)]
        for layer in self._paged:
            layer.fused_decode, layer.precompiled = fused_decode, precompiled_kernels
        self._gated_delta, self._precompiled = gated_delta, precompiled_kernels
        self.step_timer: NoTimer = NO_TIMER
        recurrent = [layer for layer in self._layers if isinstance(layer, StateSlots)]
        self._budget = device_budget(memory_budget_gb, gpu)
        self._weights = weight_bytes(self._model)
        self.plan = size or plan_size(
            rows=rows,
            ctx=ctx,
            gpu=gpu,
            train_context=directory.train_context,
            config=directory.config,
            attention_layers=len(self._paged),
            prefix_cache=prefix_cache,
            prefill_chunk=prefill_chunk,
            min_ctx=min_ctx,
            budget=self._budget,
            weights=self._weights,
            cache_limit=int(cache_limit_gb * (1 << 30)),
        )
        mx.set_cache_limit(self.plan.cache_limit)
        # on CUDA decode passes are padded to a few row counts (shape_buckets.py); the padding rows all
        # point at one scratch slot past the real ones, with a KV block and recurrent state of its own
        self._pad_decode = shape_buckets.enabled()
        if self._pad_decode:  # the scratch slot's KV block comes on top of what the rows may hold
            self.plan = replace(self.plan, max_blocks=self.plan.max_blocks + 1)
        if recurrent and self._pad_decode:
            recurrent[0].ledger.scratch = self.plan.rows
        self._eos = directory.eos_ids
        tok = self._tokenizer
        self.info = ModelInfo(
            name=name,
            engine="mlx",
            architecture=directory.model_type,
            chat_template=directory.chat_template,
            bos_token=tok.bos_token,
            eos_token=tok.eos_token or (tok.decode([min(self._eos)]) if self._eos else ""),
            context_length=self.plan.ctx,
            rows=self.plan.rows,
            recurrent=bool(recurrent),
            train_context_length=directory.train_context,
            embedding=None
            if group is not None
            else generative_spec(directory.config, self.plan.ctx, tok.vocab_size, (name, path.name)),
        )

        self._alloc = BlockAllocator()
        self._pool = (
            PrefixPool(
                self._alloc,
                self.plan.pool_entries,
                exact_only=bool(recurrent),
                state_bytes=self.plan.pool_state_bytes,
            )
            if prefix_cache
            else None
        )
        self._batch = StepBatch(
            self.plan.rows, self.plan.ctx, model_vocab(self._model, tok.vocab_size), pad=self._pad_decode
        )
        self._grow(self.plan.initial_blocks)
        if self._pad_decode:  # the scratch slot's block: padding rows write their K/V there, never read
            self._batch.set_table(self.plan.rows, self._take_blocks(1))
        # [rows, PENALTY_WINDOW_MAX] recent tokens of every row, once some request uses penalties
        self._history: mx.array | None = None
        self._rows: dict[tuple[str, int], Row] = {}
        self._slots: list[Row | None] = [None] * self.plan.rows
        self._held = 0  # free slots promised to choices not forked yet (Row.unborn)
        self._order = 0
        self._finished_early: list[JobUpdate] = []
        self._inflight: Inflight | None = None
        self._split: SplitChunk | None = None  # a prompt's chunk part-way through its layers
        self._dispatched_bytes = 0  # bytes MLX's allocator grew by when the running step was dispatched
        self._copies: list[tuple[int, int]] = []  # (src, dst) KV blocks to copy before the next passes
        self._step_prefill = 0  # positions this step's prefill passes compute, padding included
        self._peaks = PeakWindow()  # MLX's high-water mark, per step (the account's peak_recent)
        chunk, timed = self.plan.prefill_chunk, not kernels.on_cuda_gpu()  # CUDA: the cap (prefill_budget)
        self._clock = StepClock(PrefillBudget.on(step_budget_ms, chunk, gpu=gpu, timed=timed))
        self._grammar: GrammarVocab | None = None  # built with the first constrained job
        self._masks: MaskTable | None = None
        self._counts = {"prompt": 0, "generated": 0, "reused": 0, "steps": 0, "last": 0}
        if self_check:
            self_check_engine(self)  # a batched-cache mismatch fails here, at load
        if warm_up and self._pad_decode and group is None:  # a shard's passes hold collectives
            rows, ctx = self.plan.rows, self.plan.ctx
            shapes = warm_shapes(
                rows, recurrent=bool(recurrent), split=fused_decode, ctx=ctx, split_parts=self._split_parts
            )
            run_warm_up(shapes, self._scratch_pass(), self._batch.vocab)
            reset_row(recurrent, self.plan.rows)  # the warm-up's passes ran the scratch slot as a row
        self._peaks.restart()
        log.info(
            "loaded %s (%s): %d rows x %d tokens, prefix pool %s",
            name,
            directory.model_type,
            self.plan.rows,
            self.plan.ctx,
            "on" if prefix_cache else "off",
        )

    # ---- the Engine protocol ------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    embed_tokenize = tokenize  # a generative model embeds what it would read

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Last-token states (mlx-lm's backbone, no cache), beside the rows' caches."""
        spec = self.info.embedding
        assert spec is not None
        return embed_generative(self._model, inputs, spec.batch_tokens)

    def detokenize(self, tokens: list[int]) -> str:
        return self._tokenizer.decode(tokens)

    @property
    def free_rows(self) -> int:
        if self._rows and over_budget(self._budget):
            return 0  # over the memory budget: new rows wait for running ones to finish
        return self._slots.count(None) - self._held

    @property
    def has_work(self) -> bool:
        return bool(self._rows) or self._inflight is not None or bool(self._finished_early)

    def submit(self, job: GenerationJob) -> int:
        """Give the job a row, adopting a saved prefix; returns how many prompt tokens were adopted.
        The job's other choices hold free slots until its prompt is in, then fork from it (`_fork`)."""
        if any(key[0] == job.job_id for key in self._rows):
            raise InvalidRequest(f"job {job.job_id} is already running")
        check_prompt(job.prompt, ctx=self.plan.ctx, vocab=self._batch.vocab)
        check_bias_ids(job.sampling, self._batch.vocab)
        if job.max_tokens <= 0:
            self._finished_early.extend(
                JobUpdate(job.job_id, finish="length", choice=c) for c in range(job.choices)
            )
            return 0
        if self._slots.count(None) - self._held < max(1, job.choices):
            raise Busy("no free row", retry_after=1.0)
        slot = self._slots.index(None)
        grammar = self._grammar_vocab().start(job.constraint) if job.constraint is not None else None
        self._order += 1
        row = Row(slot, job, self._order, self.plan.ctx, self._tokenizer.piece)
        row.grammar = grammar
        row.unborn = job.choices - 1
        self._held += row.unborn
        self._slots[slot] = row
        self._rows[row.key] = row
        reset_row([layer for layer in self._layers if isinstance(layer, StateSlots)], slot)
        if self._pool is not None:
            self._adopt(row)
        if needs_penalties(job.sampling):
            self._init_history(row)
        self._batch.changed()
        return row.reused

    def cancel(self, job_id: str) -> None:
        for key in [key for key in self._rows if key[0] == job_id]:
            row = self._rows[key]
            self._release(row, save=False)
            self._finished_early.append(JobUpdate(job_id, finish="cancelled", choice=row.choice))

    def step(self) -> list[JobUpdate]:
        self.step_timer.start()
        updates, self._finished_early = self._finished_early, []
        read_back, self._step_prefill = self._inflight is not None, 0
        try:
            dispatched = self._dispatch(updates)
            if self._inflight is not None:
                updates.extend(self._collect(self._inflight))
        except Exception as exc:
            raise EngineFailure(f"MLX step failed: {exc}") from exc
        self._clock.ended(time.perf_counter(), read_back=read_back, prefill=self._step_prefill)
        self._inflight = dispatched
        self._counts["steps"] += 1
        self._peaks.sample()
        self.step_timer.stop()
        return updates

    @property
    def prefill_budget(self) -> PrefillBudget:  # a distributed rank 0 shares its answers (distributed/)
        return self._clock.budget

    @prefill_budget.setter
    def prefill_budget(self, budget: PrefillBudget) -> None:
        self._clock.budget = budget

    def stats(self) -> EngineStats:
        c = self._counts
        account = mlx_account(
            weights=self._weights,
            paged=self._paged,
            recurrent=[layer for layer in self._layers if isinstance(layer, StateSlots)],
            pool=self._pool,
            in_flight=self._dispatched_bytes,
            budget=self._budget,
        )
        return EngineStats(
            rows_total=self.plan.rows,
            rows_busy=len(self._rows),
            tokens_last_step=c["last"],
            prompt_tokens_total=c["prompt"],
            generated_tokens_total=c["generated"],
            reused_tokens_total=c["reused"],
            prefix_lookups=self._pool.lookups if self._pool else 0,
            prefix_hits=self._pool.hits if self._pool else 0,
            steps_total=c["steps"],
            memory={
                **account.as_dict(),
                **self._peaks.as_dict(),
                "kv_blocks_used": self._alloc.used,
                "kv_blocks_total": self._alloc.total,
            },
        )

    def close(self) -> None:
        if self._inflight is not None:
            mx.eval(self._inflight.tokens)
            self._inflight = None
        self._rows.clear()
        self._split = None
        self._slots = [None] * len(self._slots)
        if self._pool is not None:
            self._pool.clear()
        self._layers, self._paged, self._model, self._history, self._decoder = [], [], None, None, None
        self._hybrid = None
        if self._old_wired_limit is not None:
            mx.set_wired_limit(self._old_wired_limit)
            self._old_wired_limit = None
        mx.clear_cache()

    # ---- one step -------------------------------------------------------------------------

    def _dispatch(self, updates: list[JobUpdate]) -> Inflight | None:
        """Build this step's passes and start them on the device; returns the decode pass's tokens."""
        for row in [r for r in self._slots if r is not None and r.unborn and r.ready]:
            self._fork(row)
        self._flush_copies()
        active = [row for row in self._slots if row is not None]
        decoding = [row for row in active if row.ready and row.can_feed]
        split = self._split
        if split is not None and split.rows[0].done:  # released mid-chunk: nothing of it is kept
            split = self._split = None
        filling = sorted((row for row in active if not row.ready), key=lambda r: r.order)
        self._dispatched_bytes = 0
        decoded = self._decode(decoding, updates) if decoding else None
        if decoded is not None:
            history = [] if self._history is None else [self._history]
            self._launch([*self._cache_arrays(), decoded.tokens, *(decoded.logprobs or ()), *history])
        processed = len(decoding)
        # beside decoding rows, the prompt tokens that fit the step time budget (prefill_budget.py)
        burst = self._clock.budget.burst(len(filling), len(decoding))
        room = self._clock.budget.room(self.plan.prefill_chunk, bool(decoding), burst=burst)
        # past SHORT_CONTEXT keys beside decoding rows (CUDA), a prompt's chunks keep the warm-up's shape
        untimed = self._pad_decode and bool(decoding) and not self._clock.budget.timed
        long_chunk = LONG_CONTEXT_QUERIES if untimed and room >= LONG_CONTEXT_QUERIES else None
        self._step_prefill = 0
        if split is not None:  # a chunk part-way through its layers goes on first (prompt_passes.py)
            filling = [row for row in filling if row is not split.rows[0]]
            room -= split.prefill.tokens
            processed += self._split_part(updates, every=not decoding)
        passes = (
            plan_prefill(filling, room, ladder=self._pad_decode, long_chunk=long_chunk) if room > 0 else []
        )
        self._step_prefill += sum(p.tokens for p in passes)
        if decoding:
            self._clock.budget.took(self._step_prefill, room)
        for prefill in passes:
            parts = self._parts(prefill) if long_chunk and self._split is None else 1
            if parts > 1:
                processed += self._start_split(prefill, parts, updates)
                continue
            processed += self._prefill(prefill)
            self._launch(self._cache_arrays())
            self._passed(prefill, updates)
        if decoded is None and processed == 0:
            return None
        self._counts["last"] = processed
        return decoded

    def _launch(self, outputs: list[mx.array]) -> None:
        """Start one pass on the device, apart from the step's other passes. On CUDA MLX cuts what one
        eval encodes into CUDA graphs of ~20 kernels, each instantiated the first time its topology
        comes up (warm_up.py): a pass evaluated after another would start mid-graph at an offset
        that depends on the other pass, making graphs the warm-up never ran. The allocator's growth
        meanwhile is the account's scratch (MLX allocates a pass's buffers as it encodes it)."""
        self.step_timer.lap("build", outputs)
        before = mx.get_active_memory()
        mx.async_eval(outputs)
        self._dispatched_bytes += max(0, mx.get_active_memory() - before)
        self.step_timer.lap("launch")

    def _cache_arrays(self) -> list[mx.array]:
        return cache_arrays(self._layers)

    def forward(self, inputs: mx.array, views: list) -> mx.array:
        """One forward pass of the model over kinfer's caches (the CUDA recurrence kernel may run)."""
        decoder = self._decoder if self._decoder is not None and self._decoder.takes(inputs) else None
        with kinfer_pass(kernel=self._gated_delta, precompiled=self._precompiled):
            out = self._model(inputs, cache=views) if decoder is None else decoder(inputs, views)
        if self._agree is not None:  # sharded: this pass's collectives run now, in order (agree.py)
            logits = out if inputs.shape[1] == 1 else []
            mx.eval(self._cache_arrays(), logits)
        return out

    # ---- rows, blocks and the prefix pool ---------------------------------------------------

    def _views(self, layout: PassLayout, rows: np.ndarray, lengths: mx.array | None = None) -> list:
        return pass_views(self._layers, layout, rows, lengths, read_apart=self._pad_decode)
