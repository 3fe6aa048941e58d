"""One error hierarchy. Each carries an HTTP status and a short type; dialects render envelopes."""

from __future__ import annotations


class KinferError(Exception):
    """Base of every error kinfer reports to a caller."""

    status: int = 500
    kind: str = "server_error"

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


class ModelNotFound(KinferError):
    status = 404
    kind = "not_found_error"


class AmbiguousModel(KinferError):
    status = 400
    kind = "invalid_request_error"


class PromptTooLong(KinferError):
    status = 413
    kind = "request_too_large"


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
