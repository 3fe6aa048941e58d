"""Render a request with the model's template, tokenize it and fit it into one row.

Runs on a thread of the scheduler's preparation pool, for the request's own task (Scheduler.submit),
never on the engine thread, so a long prompt cannot stall the rows that are streaming. A prompt that
does not fit is refused with `PromptTooLong`, or, when the request asks for it
(`truncation="drop_oldest"`), rendered again without its oldest messages until it fits, the way
Ollama's `chatPrompt` and OpenAI's `truncation: "auto"` do: every system message stays, a tool result
is never kept without the call it answers, and the newest message always stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from kinfer.chat.template import RenderedPrompt, render_prompt
from kinfer.chat.traits import TemplateTraits
from kinfer.constrain.build import build_constraint
from kinfer.engines.base import GenerationJob, ModelInfo
from kinfer.errors import InvalidRequest, KinferError, PromptTooLong
from kinfer.protocol import ChatRequest
from kinfer.scheduler.jobs import PreparedJob

log = logging.getLogger(__name__)

# no tokenizer averages this many characters per token over a whole prompt; a longer prompt cannot
# fit, so it is refused before tokenizing it (10 MB of text would hold a preparation thread ~10 s)
MAX_CHARS_PER_TOKEN = 64

Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class _Attempt:
    """One rendering of a request and its length; `tokens` is None when it was too long to tokenize."""

    request: ChatRequest
    rendered: RenderedPrompt
    tokens: list[int] | None
    length: int  # tokens, or a lower bound of them when `tokens` is None

    def fits(self, context_length: int) -> bool:
        return self.tokens is not None and self.length < context_length  # at least one token of reply


def prepare_job(
    info: ModelInfo,
    tokenize: Tokenize,
    request: ChatRequest,
    job_id: str,
    detokenize: Callable[[list[int]], str] | None = None,
) -> PreparedJob:
    """The request as a job that fits one row: rendered, tokenized and its reply budget clipped.

    `detokenize` reads back the request's `context` (Ollama), which goes ahead of the rendered prompt."""
    if not info.chat:
        raise InvalidRequest(f"{info.name} is an embedding model; it does not support chat or generate")
    attempt = _attempt(info, tokenize, request, detokenize)
    if not attempt.fits(info.context_length):
        truncate = request.truncation == "drop_oldest" and request.raw_prompt is None
        shorter = _without_oldest(info, tokenize, request, detokenize) if truncate else None
        if shorter is None:
            raise _too_long(info, attempt, truncated=truncate)
        log.info(
            "%s: a prompt of %d tokens does not fit a row of %d; dropped its %d oldest messages (%d left)",
            job_id,
            attempt.length,
            info.context_length,
            len(request.messages) - len(shorter.request.messages),
            shorter.length,
        )
        attempt = shorter
    tokens = attempt.tokens or []
    if not tokens:
        # nothing to condition on: an empty raw prompt, or a template that rendered to nothing
        raise InvalidRequest("the prompt is empty once rendered; send some text to continue from")
    room = info.context_length - len(tokens)
    max_tokens = min(request.max_tokens, room) if request.max_tokens else room
    rendered = attempt.rendered
    checkpoints = _checkpoint_tokens(tokenize, rendered.text, rendered.checkpoints, tokens)
    job = GenerationJob(
        job_id=job_id,
        prompt=tuple(tokens),
        sampling=request.sampling,
        max_tokens=max_tokens,
        stop=request.stop,
        ignore_eos=request.ignore_eos,
        checkpoints=checkpoints,
        constraint=build_constraint(request, rendered),
        choices=request.n,
    )
    return PreparedJob(job=job, rendered=rendered, prompt_tokens=len(tokens))


def _attempt(
    info: ModelInfo,
    tokenize: Tokenize,
    request: ChatRequest,
    detokenize: Callable[[list[int]], str] | None = None,
) -> _Attempt:
    rendered = render_prompt(
        info.chat_template, request, bos_token=info.bos_token, eos_token=info.eos_token, name=info.name
    )
    if request.strict_capabilities:
        check_capabilities(info.name, request, rendered.traits)
    if request.context and detokenize is not None:
        rendered = _after_context(rendered, request.context, info, detokenize)
    if len(rendered.text) > info.context_length * MAX_CHARS_PER_TOKEN:
        return _Attempt(request, rendered, None, len(rendered.text) // MAX_CHARS_PER_TOKEN)
    tokens = tokenize(rendered.text)
    return _Attempt(request, rendered, tokens, len(tokens))


def _without_oldest(
    info: ModelInfo,
    tokenize: Tokenize,
    request: ChatRequest,
    detokenize: Callable[[list[int]], str] | None = None,
) -> _Attempt | None:
    """The request with the fewest oldest messages dropped that fits, or None if none does.

    A cut may start at any user or assistant message after the first one kept in full (never at a
    tool result); system messages before the cut stay. Fewer messages render shorter, so the cut is
    found by bisection. A cut the template refuses (Qwen3.5: "No user query found") counts as having
    dropped too much.
    """
    messages = request.messages
    first = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
    cuts = [i for i in range(first + 1, len(messages)) if messages[i].role in ("user", "assistant")]
    best: _Attempt | None = None
    low, high = 0, len(cuts) - 1
    while low <= high:
        middle = (low + high) // 2
        cut = cuts[middle]
        kept = tuple(m for m in messages[:cut] if m.role == "system") + messages[cut:]
        try:
            attempt = _attempt(info, tokenize, replace(request, messages=kept), detokenize)
        except InvalidRequest as exc:
            log.debug("truncating at message %d: the template refuses the rest (%s)", cut, exc)
            high = middle - 1
            continue
        if attempt.fits(info.context_length):
            best, high = attempt, middle - 1
        else:
            low = middle + 1
    return best


def limit_reason(info: ModelInfo) -> str:
    """What a row holds and what sets it: the model's trained context, or kinfer's --ctx below it."""
    ctx, trained = info.context_length, info.train_context_length
    row = f"a row of {info.name} holds {ctx} tokens, prompt and reply together"
    if trained and ctx >= trained:
        return f"{row}: all {trained} the model was trained for, so a larger --ctx would not help"
    if trained:
        return (
            f"{row}, the size kinfer's --ctx (or Ollama's num_ctx) gives a row; the model was trained for "
            f"{trained}, so restarting kinfer with a larger --ctx (up to {trained}) would fit more"
        )
    return f"{row}, the size kinfer's --ctx (or Ollama's num_ctx) gives a row"


def _too_long(info: ModelInfo, attempt: _Attempt, *, truncated: bool) -> PromptTooLong:
    size = (
        f"{attempt.length} tokens"
        if attempt.tokens is not None
        else f"{len(attempt.rendered.text)} characters (at least {attempt.length} tokens)"
    )
    also = ", and too long even without its oldest messages" if truncated else ""
    why = limit_reason(info)
    return PromptTooLong(
        f"the prompt is {size}{also}; {why}; shorten the prompt",
        prompt_tokens=attempt.length,
        limit=info.context_length,
        why=why,
        raw_prompt=attempt.request.raw_prompt is not None,
    )


def _checkpoint_tokens(
    tokenize: Tokenize, text: str, offsets: tuple[int, ...], tokens: list[int]
) -> tuple[int, ...]:
    """Token counts of the rendered prefixes, kept only where the prefix tokenizes as a true prefix."""
    counts = []
    for offset in offsets:
        if not 0 < offset < len(text):
            continue
        head = tokenize(text[:offset])
        if 0 < len(head) < len(tokens) and tokens[: len(head)] == head:
            counts.append(len(head))
    return tuple(sorted(set(counts)))


def check_capabilities(name: str, request: ChatRequest, traits: TemplateTraits) -> None:
    """Ollama's 400 for thinking or tools the model's template cannot serve.

    Tools need a template that either lets kinfer write its own tool prompt ("default") or teaches a
    call format kinfer parses; a template that prints tools its own way (Llama 3's bare JSON) cannot."""
    model = request.model or name  # Ollama names the model as the client did, in these words
    if request.think and not (traits.supports_thinking or traits.has_think_switch):
        raise InvalidRequest(f'"{model}" does not support thinking')
    if request.tools and traits.tool_format == "none":
        raise InvalidRequest(f"{model} does not support tools")


def _after_context(
    rendered: RenderedPrompt,
    context: tuple[int, ...],
    info: ModelInfo,
    detokenize: Callable[[list[int]], str],
) -> RenderedPrompt:
    """The prompt with an earlier exchange's tokens read back as text in front of it, as Ollama does."""
    if len(context) > info.context_length:
        why = limit_reason(info)
        raise PromptTooLong(
            f"context holds {len(context)} tokens; {why}",
            prompt_tokens=len(context),
            limit=info.context_length,
            why=why,
        )
    try:
        before = detokenize(list(context))
    except KinferError:
        raise
    except Exception as exc:  # an id the vocabulary does not have
        raise InvalidRequest(f"context: not token ids of {info.name} ({exc})") from None
    checkpoints = tuple(len(before) + offset for offset in rendered.checkpoints)
    return replace(rendered, text=before + rendered.text, checkpoints=checkpoints)
