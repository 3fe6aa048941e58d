"""One error hierarchy. Each carries an HTTP status and a short type; dialects render envelopes.

`code` is the machine-readable reason OpenAI clients key on (`model_not_found`,
`context_length_exceeded`); None where the official API sends none.
"""

from __future__ import annotations


class KinferError(Exception):
    """Base of every error kinfer reports to a caller."""

    status: int = 500
    kind: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class InvalidRequest(KinferError):
    status = 400
    kind = "invalid_request_error"


class Unauthorized(KinferError):
    status = 401
    kind = "authentication_error"
    code = "invalid_api_key"


class Forbidden(KinferError):
    """The caller may not use this server at all: a Host or an Origin it does not answer to."""

    status = 403
    kind = "permission_error"


class ModelNotFound(KinferError):
    status = 404
    kind = "not_found_error"
    code = "model_not_found"


class RouteNotFound(KinferError):
    """A path (or method) kinfer does not serve."""

    status = 404
    kind = "not_found_error"


class AmbiguousModel(KinferError):
    status = 400
    kind = "invalid_request_error"


class PromptTooLong(KinferError):
    """The rendered prompt does not fit a row (prompt and reply share the row's context).

    `prompt_tokens` is the prompt's length (a lower bound when it was too long to tokenize), `limit`
    the row's context in tokens, `why` what sets that limit; `raw_prompt`: the prompt was given
    verbatim (OpenAI Completions, Ollama raw generate) rather than as messages.
    """

    status = 400
    kind = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(
        self,
        message: str,
        *,
        prompt_tokens: int = 0,
        limit: int = 0,
        why: str = "",
        raw_prompt: bool = False,
    ) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        self.why = why
        self.raw_prompt = raw_prompt


class RequestTooLarge(KinferError):
    """A request body over --max-body-mb (refused before it is read)."""

    status = 413
    kind = "request_too_large"


class UnsupportedMediaType(KinferError):
    status = 415
    kind = "invalid_request_error"


class Busy(KinferError):
    status = 503
    kind = "overloaded_error"


class EngineFailure(KinferError):
    status = 500
    kind = "server_error"


class StoreError(KinferError):
    """A store operation that cannot be carried out (refused rm, bad layout, disk full)."""

    status = 400
    kind = "invalid_request_error"
