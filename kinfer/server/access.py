"""Who may call: the API key check and CORS. Both run before any dialect sees the request."""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from quart import Quart, Response, request

from kinfer.config import Settings
from kinfer.errors import Unauthorized

OPEN_PATHS = frozenset({"/health"})
CORS_METHODS = "GET, POST, DELETE, OPTIONS, HEAD"
CORS_MAX_AGE = "600"


def presented_key() -> str | None:
    """The key from `Authorization: Bearer ...` or `x-api-key` (Anthropic's header)."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


def key_matches(presented: str | None, expected: str) -> bool:
    # compare_digest takes the same time wherever the strings differ
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


class OriginPolicy:
    """Origins allowed to call from a browser. An entry without a port admits any port of that host."""

    def __init__(self, origins: str) -> None:
        entries = [o.strip().rstrip("/") for o in origins.split(",") if o.strip()]
        self.any = "*" in entries
        self._exact = {e.lower() for e in entries if urlsplit(e).port is not None}
        self._hosts = {
            (urlsplit(e).scheme.lower(), (urlsplit(e).hostname or "").lower())
            for e in entries
            if e != "*" and urlsplit(e).port is None
        }

    def allows(self, origin: str) -> bool:
        if self.any:
            return True
        origin = origin.rstrip("/").lower()
        if origin in self._exact:
            return True
        parts = urlsplit(origin)
        return (parts.scheme, parts.hostname or "") in self._hosts


def install_access_control(app: Quart, settings: Settings) -> None:
    policy = OriginPolicy(settings.origins)
    api_key = settings.api_key

    @app.before_request
    async def _check_access() -> Response | None:
        origin = request.headers.get("origin")
        if request.method == "OPTIONS" and request.headers.get("access-control-request-method"):
            response = Response("", status=204)
            if origin and policy.allows(origin):
                response.headers["Access-Control-Allow-Origin"] = origin if not policy.any else "*"
                response.headers["Access-Control-Allow-Methods"] = CORS_METHODS
                asked = request.headers.get("access-control-request-headers")
                response.headers["Access-Control-Allow-Headers"] = asked or "authorization, content-type"
                response.headers["Access-Control-Max-Age"] = CORS_MAX_AGE
                response.headers["Vary"] = "Origin"
            return response
        if api_key and request.path not in OPEN_PATHS and not key_matches(presented_key(), api_key):
            raise Unauthorized("a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)")
        return None

    @app.after_request
    async def _cors_headers(response: Response) -> Response:
        origin = request.headers.get("origin")
        if origin and policy.allows(origin) and "Access-Control-Allow-Origin" not in response.headers:
            response.headers["Access-Control-Allow-Origin"] = origin if not policy.any else "*"
            response.headers["Vary"] = "Origin"
        return response
