"""The one internal request type and the one event stream every dialect translates to and from."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kinfer.errors import InvalidRequest

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "deadline", "error"]
DeltaKind = Literal["text", "thinking"]


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made (or made earlier, when replayed in the history)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    thinking: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # for role == "tool": which call this answers
    name: str | None = None  # for role == "tool": the function's name


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call; `parameters` is a JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sampling:
    """Sampling in llama.cpp's order: repeat penalty -> top-k -> top-p -> min-p -> temperature -> draw."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    # (token id, bias) pairs added to the row's logits before anything else: -100 bans, +100 forces
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None: no logprobs; 0..MAX_TOP_LOGPROBS: each generated token's logprob and this many alternatives
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def given(self, **values: float | int | None) -> Sampling:
        """These defaults with the values a client sent; None means "not sent"."""
        return replace(self, **{name: value for name, value in values.items() if value is not None})


MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs, which every dialect keeps
MAX_LOGIT_BIAS = 100.0  # |bias| at most this, as OpenAI's logit_bias


ThinkLevel = Literal["low", "medium", "high"]
# What to do with a prompt longer than a row holds: refuse it ("error": OpenAI, Anthropic, Responses'
# truncation "disabled"), or drop the oldest turns until it fits, keeping every system message
# ("drop_oldest": Ollama's default, Responses' truncation "auto").
Truncation = Literal["error", "drop_oldest"]


@dataclass(frozen=True)
class ResponseFormat:
    """Structured output: the answer must be a JSON object (`json_object`), or JSON valid against
    `schema` (`json_schema`). Every schema is enforced, whatever `strict` says; a schema the grammar
    engine cannot enforce is refused (400) rather than loosened."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None
    name: str = ""
    strict: bool = False


@dataclass(frozen=True)
class ChatRequest:
    """What every dialect's request becomes.

    `think`: None = the template's default, True = open a think block, False = the empty think block.
    `raw_prompt`: a prompt that bypasses the chat template (/v1/completions, Ollama raw generate).
    `keep_alive`: seconds to keep the model loaded after this request; None = server default,
    0 = unload when done, negative = never unload.
    `tool_choice`: "auto" lets the model answer or call; "required" (or a function's name) forces a
    call (to that function), in the model's own tool-call format, arguments valid against its schema.
    `parallel_tool_calls`: False allows one call per reply. `response_format`: structured output.
    `stop`: strings that end the reply. They are matched by the engine on everything the model
    generates, thinking and tool-call markup included (the think splitter runs later, on the event
    loop); the matched string and what follows it are never sent, and `Done.stop_string` names it.
    `truncation`: see `Truncation`; applied where the prompt is rendered and tokenized.
    `context`: token ids of an earlier exchange (Ollama's /api/generate `context`), read back as text
    ahead of the rendered prompt.
    `return_context`: when the reply ends, tokenize prompt and reply together (Ollama's `context`,
    which a client sends back to continue); the stream's `context` holds the ids.
    `strict_capabilities`: asking for thinking, or sending tools, that the model's template cannot
    serve is refused (Ollama's 400 `"<model>" does not support thinking`) rather than ignored.
    `n`: choices to generate (OpenAI's `n`): one prefill, then n rows decoding side by side; with a
    seed, choice i draws with seed + i. Events carry their choice's index.
    """

    model: str
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"  # "auto" | "none" | "required" | a function name
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    think: bool | None = None
    think_level: ThinkLevel | None = None
    raw_prompt: str | None = None
    keep_alive: float | None = None
    num_ctx: int | None = None
    ignore_eos: bool = False
    truncation: Truncation = "error"
    dialect: str = "openai"
    request_id: str = ""
    context: tuple[int, ...] = ()
    return_context: bool = False
    strict_capabilities: bool = False
    n: int = 1


MAX_CHOICES = 16  # n above this is refused: each choice takes a row of its own


def validate_request(request: ChatRequest) -> None:
    """The checks every dialect needs, run once by the scheduler (`submit`, `count_tokens`);
    dialect-specific checks live in the dialects. Raises `InvalidRequest`."""
    if request.raw_prompt is None and not request.messages:
        raise InvalidRequest("messages must not be empty")
    if request.max_tokens is not None and request.max_tokens < 1:
        raise InvalidRequest("max_tokens must be at least 1")
    if not 1 <= request.n <= MAX_CHOICES:
        raise InvalidRequest(f"n: must be between 1 and {MAX_CHOICES}")
    if request.tool_choice not in ("auto", "none"):
        if not request.tools:
            raise InvalidRequest(f"tool_choice {request.tool_choice!r} needs tools; the request has none")
        names = {tool.name for tool in request.tools}
        if request.tool_choice != "required" and request.tool_choice not in names:
            raise InvalidRequest(f"tool_choice names {request.tool_choice!r}, which is not among the tools")
    sampling = request.sampling
    if sampling.logprobs is not None and not 0 <= sampling.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    for token, bias in sampling.logit_bias:
        if token < 0:
            raise InvalidRequest(f"logit_bias: token id {token} is negative")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise InvalidRequest(f"logit_bias: the bias of token {token} must be between -100 and 100")
    fmt = request.response_format
    if fmt is not None and fmt.kind == "json_schema" and not isinstance(fmt.schema, dict):
        raise InvalidRequest("a json_schema response format needs a schema (a JSON object)")


# ---- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopLogprob:
    """One candidate token and its log-probability. `text` is its bytes decoded leniently (a token
    may hold part of a UTF-8 character); `bytes` are exact."""

    id: int
    text: str
    bytes: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the `top` most likely tokens at its place, best
    first. Values are the log-softmax of the logits the row sampled from: after `logit_bias` and a
    grammar's mask, before repeat penalties and temperature (so greedy's choice is `top[0]`)."""

    token: TopLogprob
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class Delta:
    """A piece of the reply: answer text or thinking text. `logprobs`: the generated tokens whose text
    this piece releases (only when the request asked for logprobs)."""

    text: str
    kind: DeltaKind = "text"
    choice: int = 0  # which of the request's n choices
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete tool call, emitted as soon as the parser has seen all of it."""

    call: ToolCall
    index: int
    choice: int = 0


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens adopted from the prefix pool

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Seconds spent in each phase of one request."""

    queued: float = 0.0
    load: float = 0.0
    prompt: float = 0.0
    decode: float = 0.0
    total: float = 0.0


@dataclass(frozen=True)
class Done:
    """A reply (one choice) ended. `stop_string`: which of `ChatRequest.stop` ended it (matched by the
    engine on the raw generated text, so possibly inside thinking); None when it ended another way."""

    reason: FinishReason
    usage: Usage
    timings: Timings
    detail: str | None = None  # why, when the reason alone does not say (e.g. "generation deadline")
    stop_string: str | None = None
    # which choice ended; with n > 1 each choice has its own Done, and `usage` is the request's so far
    # (prompt once, completion summed over the choices): the last Done's usage is the whole request's
    choice: int = 0


@dataclass(frozen=True)
class ErrorEvent:
    error: Exception


Event = Delta | ToolCallEvent | Done | ErrorEvent
