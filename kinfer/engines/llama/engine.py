"""The llama.cpp engine: GGUF models, continuous batching over one llama.cpp context.

One context holds `rows` sequence ids for replies plus one pool slot per row for saved prompts
(see prefix.py), each with its own KV stream. Each `step` is one forward pass (`llama_decode`)
carrying every generating row's next token, then chunks of waiting prompts up to the step's token
budget (each chunk in a decode call of its own: see `step`); logits are computed only where a token
is sampled. Each row samples with its own llama.cpp sampler chain. A row is freed the moment it
finishes or is cancelled, and only its own cells are dropped, so the next job can take it at once.
A batched row, a chunked prompt and a prompt adopted from the pool all reproduce the solo cold
run's tokens exactly (see chunking.py and native.create_context for what that takes).

Everything here runs on the scheduler's engine thread, which also builds the engine.
"""

from __future__ import annotations

import heapq
import logging
import time
from pathlib import Path
from typing import Literal

import numpy as np

from kinfer.engines.base import EngineStats, GenerationJob, JobUpdate, ModelInfo
from kinfer.engines.embedding import MAX_EMBED_TOKENS
from kinfer.engines.llama import choices, native, samplers
from kinfer.engines.llama.chunking import chunk_end
from kinfer.engines.llama.decode_threads import DecodeThreads
from kinfer.engines.llama.embed import embedding_spec, tokenize_special
from kinfer.engines.llama.embed_context import LlamaEmbedder
from kinfer.engines.llama.logits import RowLogits
from kinfer.engines.llama.memory import BufferSizes, device_budget, gguf_state_bytes, llama_account
from kinfer.engines.llama.prefix import PrefixPool
from kinfer.engines.llama.rows import Row, RowKey
from kinfer.engines.llama.sizing import SizePlan, plan_size
from kinfer.engines.llama.thread_tuner import TunerConfig
from kinfer.engines.logprobs import check_bias_ids
from kinfer.engines.prefill_budget import PrefillBudget
from kinfer.errors import Busy, EngineFailure, InvalidRequest, PromptTooLong
from kinfer.protocol import FinishReason, TokenLogprob

log = logging.getLogger(__name__)


class LlamaEngine:
    """A GGUF model served by llama.cpp, many replies per forward pass (the `Engine` protocol).

    rows / ctx / threads: 0 = automatic (see sizing.plan_size). gpu_layers: -1 offloads every
    layer when llama.cpp has a GPU backend. prefix_cache: keep recent prompts for reuse.
    exact_prefix: adopt only whole saved checkpoints (None: only for recurrent/hybrid models).
    step_tokens: tokens per forward pass, generating rows first, then prompt chunks (0 = 2048); a
    smaller budget keeps generating rows moving while long prompts prefill. step_budget_ms: the
    step time prompt chunks fit in while rows generate (0: automatic; prefill_budget.py). min_ctx:
    raises an automatic ctx to a request's larger one (sizing.plan_size). thread_tuning: how decode
    steps choose their thread count on a CPU ("auto": thread_tuner.py's default with automatic
    threads, off with a fixed count or a GPU; a TunerConfig: that one; None: off).
    """

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        rows: int = 0,
        ctx: int = 0,
        threads: int = 0,
        prefix_cache: bool = True,
        gpu_layers: int = -1,
        exact_prefix: bool | None = None,
        step_tokens: int = 0,
        step_budget_ms: float = 0.0,
        min_ctx: int = 0,
        memory_budget_gb: float = 0.0,
        thread_tuning: TunerConfig | Literal["auto"] | None = "auto",
        flash_attn: bool | None = None,
    ) -> None:
        native.init_backend()
        gpu = native.supports_gpu_offload()
        self._model = native.load_model(Path(path), gpu_layers if gpu else 0)
        self._gpu = gpu = gpu and gpu_layers != 0  # layers on a GPU
        self._ctx = 0
        self._batch: native.TokenBatch | None = None
        try:
            self._facts = facts = native.model_facts(self._model)
            self._vocab = native.Vocab(self._model)
            self.plan: SizePlan = plan_size(
                rows=rows,
                ctx=ctx,
                threads=threads,
                prefix_cache=prefix_cache,
                gpu=gpu,
                train_context=facts.train_context,
                kv_bytes_per_token=facts.kv_bytes_per_token,
                max_sequences=native.max_sequences(),
                step_tokens=step_tokens,
                min_ctx=min_ctx,
                budget=(budget := device_budget(memory_budget_gb, gpu)),
                weights=facts.model_bytes,
                state_bytes_per_row=gguf_state_bytes(Path(path)),
                n_vocab=self._vocab.n_tokens,
            )
            self._budget = budget
            plan = self.plan
            self._ctx = native.create_context(
                self._model,
                n_ctx=plan.n_ctx,
                n_seq=plan.n_seq,
                n_batch=plan.n_batch,
                n_ubatch=plan.n_ubatch,
                threads=plan.threads,
                gpu=gpu,
                flash_attn=flash_attn,
            )
            self._batch = native.TokenBatch(plan.n_batch)
            # a user's --threads N is the override; on a GPU the thread count hardly matters
            if thread_tuning == "auto":
                auto = threads <= 0 and not gpu
                thread_tuning = TunerConfig.for_threads(plan.threads) if auto else None
            self._threads = DecodeThreads(self._ctx, plan.threads, thread_tuning)
            # prompt chunks beside generating rows keep to the step time budget (not the memory budget)
            self._pacer = PrefillBudget.on(step_budget_ms, plan.n_batch, gpu=gpu)
        except BaseException:
            self.close()
            raise
        self._mem = native.context_memory(self._ctx)
        self._row_len = native.context_seq_length(self._ctx)
        self.flash_attention = native.flash_attention(self._ctx)  # as llama.cpp resolved --flash-attn
        recurrent = facts.recurrent or facts.hybrid
        self._pool = (
            PrefixPool(
                self._mem,
                range(plan.rows, plan.n_seq),
                exact_only=recurrent if exact_prefix is None else exact_prefix,
                stream_bytes=facts.kv_bytes_per_token * self._row_len,
                gpu=self._gpu,
            )
            if plan.pool_slots
            else None
        )
        self.info = ModelInfo(
            name=name,
            engine="llama.cpp",
            architecture=facts.architecture,
            chat_template=facts.chat_template,
            bos_token=self._vocab.bos_text,
            eos_token=self._vocab.eos_text,
            context_length=self._row_len,
            rows=plan.rows,
            recurrent=recurrent,
            train_context_length=facts.train_context,
            embedding=embedding_spec(
                min(self._row_len, MAX_EMBED_TOKENS),
                native.model_embedding_length(self._model),
                "last",
                self._vocab,
                (name, native.meta_string(self._model, "general.name")),
            ),
        )
        self._embedder: LlamaEmbedder | None = None  # made on the first embedding request
        self._rows: dict[RowKey, Row] = {}
        self._free_seqs = list(range(plan.rows))  # a heap: the lowest free id first (see submit)
        self._finished: list[JobUpdate] = []  # cancellations, reported by the next step
        self._submitted = 0
        self._closed = False
        self._logits = RowLogits(self._vocab, plan.rows)  # bias, grammar masks, logprobs
        self._counters = {"prompt": 0, "generated": 0, "reused": 0, "steps": 0, "last": 0}
        log.info(
            "llama.cpp: %s (%s), %d rows x %d tokens, %d pool slots, %d threads%s, gpu offload %s, "
            "flash attention %s",
            name,
            facts.architecture,
            plan.rows,
            self._row_len,
            plan.pool_slots,
            plan.threads,
            " (decode steps: as many as the load allows)" if self._threads.tuner else "",
            "on" if self._gpu else "off",
            "on" if self.flash_attention else "off",
        )

    # ---- text ---------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a rendered prompt: special tokens parsed, BOS added only if the model wants
        one and the text does not already start with it."""
        self._check_open()
        return self._vocab.tokenize(text)

    def detokenize(self, tokens: list[int]) -> str:
        """Text of the tokens, special tokens included. An id outside the vocabulary is refused here:
        llama.cpp would abort the process on it (ids can come from a client, as Ollama's `context`)."""
        self._check_open()
        if tokens and not 0 <= min(tokens) <= max(tokens) < self._vocab.n_tokens:
            raise InvalidRequest(f"token ids must be in 0..{self._vocab.n_tokens - 1}")
        return self._vocab.detokenize(list(tokens))

    # ---- embeddings (a generative model: last-token pooling, in a context of its own) ----------

    def embed_tokenize(self, text: str) -> list[int]:
        self._check_open()
        return tokenize_special(self._vocab, text)

    def embed(self, inputs: list[tuple[int, ...]]) -> list[np.ndarray]:
        self._check_open()
        if self._embedder is None:
            spec = self.info.embedding
            assert spec is not None
            self._embedder = LlamaEmbedder(
                self._model,
                pooling="last",
                causal=True,
                max_tokens=spec.max_tokens,
                threads=self.plan.threads,
                gpu=self._gpu,
            )
        return self._embedder.embed(inputs)

    def _check_open(self) -> None:
        # the vocabulary lives in the model: using it after close() would read freed memory
        if self._closed:
            raise EngineFailure(f"the {self.info.name} engine is closed")

    # ---- rows ---------------------------------------------------------------------------------

    @property
    def free_rows(self) -> int:
        return len(self._free_seqs)

    @property
    def has_work(self) -> bool:
        return bool(self._rows or self._finished)

    def submit(self, job: GenerationJob) -> int:
        """Give the job a row per choice, adopting the longest saved prefix of its prompt from the
        pool; returns how many prompt tokens were adopted. The prompt is prefilled in the first row
        only; the others are held until it is in, then take a copy of its KV (choices.fork)."""
        self._check_open()
        if any(key[0] == job.job_id for key in self._rows):
            raise InvalidRequest(f"job {job.job_id} is already running")
        if not job.prompt:
            raise InvalidRequest("the prompt is empty")
        if len(job.prompt) > self._row_len:
            raise PromptTooLong(
                f"the prompt has {len(job.prompt)} tokens; a row of this model holds {self._row_len}",
                prompt_tokens=len(job.prompt),
                limit=self._row_len,
            )
        if len(self._free_seqs) < max(1, job.choices):
            raise Busy("no free row", retry_after=1.0)
        check_bias_ids(job.sampling, self._vocab.n_tokens)
        grammar = self._logits.grammar_vocab().start(job.constraint) if job.constraint is not None else None
        # sequences must be consecutive to share a micro-batch (llama.cpp's split_equal over KV
        # streams), so keep the busy ids packed at the bottom
        seq = heapq.heappop(self._free_seqs)
        row = Row(seq, job, self._submitted, self._make_sampler(job, 0))
        row.reserved = [heapq.heappop(self._free_seqs) for _ in range(job.choices - 1)]
        row.grammar = grammar
        self._submitted += 1
        if self._pool is not None:
            row.reused = self._pool.adopt(seq, job.prompt, self._pacer.per_token_s)
            row.tokens = list(job.prompt[: row.reused])
            self._counters["reused"] += row.reused
        self._rows[row.key] = row
        return row.reused

    def _make_sampler(self, job: GenerationJob, choice: int) -> int:
        return choices.make_sampler(job, choice, self._vocab.n_tokens, self._row_len)

    def _sample_choices(self, row: Row, index: int) -> list[tuple[RowKey, JobUpdate]]:
        """The first draw of every choice of `row`'s job (the others fork from it now)."""
        siblings = choices.fork(self._mem, row, self._make_sampler, self._logits.grammar_vocab)
        for sibling in siblings:
            self._rows[sibling.key] = sibling
        return choices.draw_each(self._ctx, self._vocab.n_tokens, [*siblings, row], index, self._sample)

    def cancel(self, job_id: str) -> None:
        """Free the job's rows now (prefilling or generating); the next step reports them cancelled."""
        for key in [key for key in self._rows if key[0] == job_id]:
            self._finished.append(self._finish(self._rows[key], "cancelled"))

    # ---- the step -----------------------------------------------------------------------------

    def step(self) -> list[JobUpdate]:
        """One forward pass for every generating row, then prompt chunks up to the step's token
        budget (first come, first served); returns what changed."""
        updates, self._finished = self._finished, []
        batch = self._batch
        if batch is None or not self._rows:
            return updates
        changed: dict[RowKey, JobUpdate] = {}
        done = 0  # tokens evaluated in this step
        began = time.perf_counter()
        generating = sorted((r for r in self._rows.values() if r.pending is not None), key=lambda r: r.seq)
        if generating:
            batch.clear()
            at = [batch.add(row.pending, len(row.tokens), row.seq, True) for row in generating]
            # constrained rows' masks are computed on another thread while llama_decode runs
            self._logits.prefetch(generating)
            self._threads.start_decode()
            decoded = self._decode(generating, changed)
            if decoded:
                self._threads.decoded(batch.n)
            self._logits.wait()
            if decoded:
                for row, index in zip(generating, at, strict=True):
                    row.tokens.append(row.pending)
                    row.pending = None
                    changed[row.key] = self._sample(row, index)
            done += batch.n
            self._pacer.decoded(time.perf_counter() - began)
        # Each prompt chunk gets a llama_decode of its own. llama.cpp splits a batch over several
        # KV streams into micro-batches with equal tokens per sequence, so a chunk beside generating
        # rows would be cut anyway, and its first token would go alone: a lone token's attention
        # takes another kernel, and the row would no longer reproduce its solo run.
        filling = sorted((r for r in self._rows.values() if r.prefilling), key=lambda r: r.order)
        burst = self._pacer.burst(len(filling), len(generating))  # more prompts than rows: a longer step
        exact = self._pool is not None and self._pool.exact_only  # chunks stop at checkpoints
        room = 0  # prompt tokens the step may take (its first chunk's cap)
        for row in filling:
            start, taken = len(row.tokens), done - len(generating)
            spent = time.perf_counter() - began  # beside generating rows, the time budget sizes the chunk
            cap = self._pacer.room(self.plan.n_batch - done, bool(generating), taken, spent, burst)
            room = cap if taken == 0 else room
            checkpoints = row.checkpoints if exact else ()
            end = chunk_end(len(row.job.prompt), start, cap, self.plan.n_ubatch, checkpoints)
            if end == start:  # nothing fits this step
                continue
            prompt, last = row.job.prompt, len(row.job.prompt) - 1
            wants_logits = end - 1 == last and row.job.max_tokens > 0
            batch.clear()
            for pos in range(start, end):
                batch.add(prompt[pos], pos, row.seq, wants_logits and pos == last)
            done += batch.n
            self._threads.for_prompt()
            chunk_began = time.perf_counter()
            if not self._decode([row], changed):
                continue
            self._pacer.prefilled(end - start, time.perf_counter() - chunk_began)
            row.tokens.extend(prompt[start:end])
            self._counters["prompt"] += end - start
            if self._pool is not None and self._pool.exact_only and end in row.checkpoints:
                self._pool.save(row.seq, row.tokens)
            if wants_logits:
                changed.update(self._sample_choices(row, batch.n - 1))
            elif not row.prefilling:  # max_tokens 0: the prompt was all there was to do
                changed[row.key] = self._finish(row, "length", flush=True)
            else:
                changed[row.key] = row.update()
        if generating:
            self._pacer.took(done - len(generating), room)
        if done:
            self._counters["steps"] += 1
            self._counters["last"] = done
        updates.extend(changed.values())
        return updates

    def _decode(self, rows: list[Row], changed: dict[RowKey, JobUpdate]) -> bool:
        """Run the batch; on failure, end its rows with "error" (the other rows carry on)."""
        assert self._batch is not None
        rc = native.decode(self._ctx, self._batch)
        if rc == 0:
            return True
        log.error("llama_decode failed (%d) on %d tokens; ending %d row(s)", rc, self._batch.n, len(rows))
        for row in rows:
            changed[row.key] = self._finish(row, "error")
        return False

    def _sample(self, row: Row, index: int) -> JobUpdate:
        """Draw the row's next token from the logits at batch `index` (biased and masked first)."""
        grammar = row.grammar
        if row.argmax_draw:
            alive, token, logprobs = self._logits.draw_greedy(self._ctx, row, index)
        else:
            alive, logprobs = self._logits.prepare(self._ctx, row, index)
            token = samplers.sampler_sample(row.sampler, self._ctx, index) if alive else -1
        if not alive:
            return self._finish(row, "error", flush=True, error=grammar.error if grammar else None)
        row.generated += 1
        self._counters["generated"] += 1
        piece = self._vocab.piece(token)
        if grammar is not None:
            grammar.accept(token, piece)
        if self._vocab.is_eog(token) and not row.job.ignore_eos:
            return self._finish(row, "stop", new_tokens=1, flush=True)
        lp = () if logprobs is None else (self._logits.record(row, logprobs, token),)
        scan = row.matcher.feed(row.decoder.feed(piece))
        if scan.matched is not None:
            return self._finish(row, "stop", text=scan.text, new_tokens=1, stop_string=scan.matched, lp=lp)
        if grammar is not None and grammar.ended:
            # the grammar is complete (or the reply left it): nothing more may follow
            reason: FinishReason = "error" if grammar.error else "stop"
            error = grammar.error
            return self._finish(row, reason, text=scan.text, new_tokens=1, flush=True, error=error, lp=lp)
        if row.generated >= row.job.max_tokens or len(row.tokens) >= self._row_len:
            # no more tokens asked for, or no cell left to feed this one back in: the row is full
            return self._finish(row, "length", text=scan.text, new_tokens=1, flush=True, lp=lp)
        row.pending = token
        return row.update(text=scan.text, new_tokens=1, lp=lp)

    def _finish(
        self,
        row: Row,
        reason: FinishReason,
        *,
        text: str = "",
        new_tokens: int = 0,
        flush: bool = False,
        stop_string: str | None = None,
        error: str | None = None,
        lp: tuple[TokenLogprob, ...] = (),
    ) -> JobUpdate:
        """Free the row (keeping a copy in the pool) and build its final update."""
        if flush:
            # the reply ended for another reason than a stop string: release the held-back tail
            tail = row.matcher.feed(row.decoder.flush())
            text += tail.text if tail.stopped else tail.text + row.matcher.flush()
            if tail.matched is not None:  # the last undecoded bytes completed a stop string after all
                reason, stop_string = "stop", tail.matched
        if self._pool is not None and reason != "error":
            self._pool.save(row.seq, row.tokens)
        native.seq_clear(self._mem, row.seq)
        samplers.free_sampler(row.sampler)
        del self._rows[row.key]
        heapq.heappush(self._free_seqs, row.seq)
        if row.reserved:  # ended before its prompt was in: the other choices end with it, unborn
            for choice, seq in enumerate(row.reserved, start=1):
                heapq.heappush(self._free_seqs, seq)
                self._finished.append(JobUpdate(row.job.job_id, finish=reason, choice=choice))
            row.reserved = []
        return row.update(
            text=text,
            new_tokens=new_tokens,
            lp=lp,
            finish=reason,
            stop_string=stop_string,
            error=error if reason == "error" else None,
        )

    # ---- stats and teardown -------------------------------------------------------------------

    def stats(self) -> EngineStats:
        c = self._counters
        pool = self._pool
        return EngineStats(
            rows_total=self.plan.rows,
            rows_busy=self.plan.rows - len(self._free_seqs),
            tokens_last_step=c["last"],
            prompt_tokens_total=c["prompt"],
            generated_tokens_total=c["generated"],
            reused_tokens_total=c["reused"],
            prefix_lookups=pool.lookups if pool else 0,
            prefix_hits=pool.hits if pool else 0,
            steps_total=c["steps"],
            threads=self._threads.decoding,
            memory=llama_account(
                native.buffer_sizes(self._model)
                + native.buffer_sizes(self._ctx)
                + (self._embedder.buffers if self._embedder else BufferSizes()),
                weights=self._facts.model_bytes,
                kv=self.plan.n_seq * self._row_len * self._facts.kv_bytes_per_token,
                pool_slots=self.plan.pool_slots,
                sequences=self.plan.n_seq,
                budget=self._budget,
            ).as_dict(),
        )

    def pool_entries(self) -> list[tuple[int, ...]]:
        """The token lists the prefix pool holds, least recently used first (for tests and `ps`)."""
        return self._pool.entries() if self._pool is not None else []

    def close(self) -> None:
        """Free the samplers, the context and the model. Safe to call twice."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if getattr(self, "_logits", None) is not None:
            self._logits.close()
        for row in getattr(self, "_rows", {}).values():
            samplers.free_sampler(row.sampler)
        self._rows = {}
        self._free_seqs = []
        if getattr(self, "_embedder", None) is not None:
            self._embedder.close()
            self._embedder = None
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        if self._ctx:
            native.free_context(self._ctx)
            self._ctx = 0
        if self._model:
            native.free_model(self._model)
            self._model = 0

    def __enter__(self) -> LlamaEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
