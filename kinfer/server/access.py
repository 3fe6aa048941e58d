"""Who may call, checked before any dialect sees the request: the Host the caller asked for (DNS
rebinding), the Origin of a browser page (cross-site requests), the API key, the body's content type,
and CORS.

A server on 127.0.0.1 is reachable by every web page the user opens. A page cannot read our answers
without CORS, but it can still *send* requests: a "simple" cross-site POST (text/plain, no
preflight) or, through DNS rebinding, a request to a name the attacker controls that now resolves
to 127.0.0.1. So on a loopback bind only loopback Host names are answered, a request whose Origin is
not allowed is refused, and a browser must send JSON as `application/json` (which needs a preflight
that only allowed origins pass). Clients that are not browsers send no Origin and are unaffected.
"""

from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from quart import Quart, Response, request

from kinfer.config import Settings
from kinfer.errors import Forbidden, Unauthorized, UnsupportedMediaType

OPEN_PATHS = frozenset({"/health"})
CORS_METHODS = "GET, POST, DELETE, OPTIONS, HEAD"
CORS_MAX_AGE = "600"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"localhost"})


def presented_key() -> str | None:
    """The key from `Authorization: Bearer ...` or `x-api-key` (Anthropic's header)."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


def key_matches(presented: str | None, expected: str) -> bool:
    # compare_digest takes the same time wherever the strings differ
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def caller_has_key(settings: Settings) -> bool:
    """True when no key is configured, or the request presents the right one."""
    return not settings.api_key or key_matches(presented_key(), settings.api_key)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """`localhost`, `*.localhost` (RFC 6761: never resolved by DNS) or a loopback IP literal."""
    host = host.lower().rstrip(".")
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    ip = _ip(host)
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def split_host(value: str) -> str:
    """The host of a Host header or a host[:port] entry, lowercased, without the port or brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class HostPolicy:
    """Host names the server answers to: the defence against DNS rebinding.

    On a loopback bind: loopback names and IPs, plus `allowed_hosts` ('*' admits any). On any other
    bind the server was deliberately exposed and clients use names we cannot know, so every Host is
    answered (as Ollama does) unless `allowed_hosts` is given; then loopback names, IP literals and
    the listed names are. An entry `*.example.com` admits every subdomain; ports are ignored.
    """

    def __init__(self, allowed_hosts: str | None, bind_host: str) -> None:
        entries = [split_host(e) for e in (allowed_hosts or "").split(",") if e.strip()]
        loopback_bind = is_loopback(bind_host) if bind_host else False
        self.any = "*" in entries or (not entries and not loopback_bind)
        self.any_ip = not loopback_bind
        self._names = {e for e in entries if not e.startswith("*.")}
        self._suffixes = tuple(e[1:] for e in entries if e.startswith("*."))

    def allows(self, host_header: str | None) -> bool:
        if self.any or not host_header:  # every browser sends Host; a client without one is no page
            return True
        host = split_host(host_header)
        if is_loopback(host) or host in self._names or host.endswith(self._suffixes):
            return True
        return self.any_ip and _ip(host) is not None


class OriginPolicy:
    """Origins allowed to call from a browser: loopback pages always, plus the configured entries.

    An entry without a port admits any port of that host; '*' admits every origin.
    """

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
        try:
            parts = urlsplit(origin)
            parts.port  # noqa: B018 - a malformed port raises here
        except ValueError:
            return False
        host = parts.hostname or ""
        if parts.scheme in ("http", "https") and host and is_loopback(host):
            return True
        return (parts.scheme, host) in self._hosts


def is_json_type(content_type: str) -> bool:
    mimetype = content_type.split(";", 1)[0].strip().lower()
    return mimetype == "application/json" or (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    )


def install_access_control(app: Quart, settings: Settings) -> None:
    hosts = HostPolicy(settings.allowed_hosts, settings.host)
    origins = OriginPolicy(settings.origins)

    @app.before_request
    async def _check_access() -> Response | None:
        host = request.headers.get("host")
        if not hosts.allows(host):
            raise Forbidden(
                f"this server does not answer to the host {split_host(host or '')[:100]!r} "
                "(a page using DNS rebinding?); add it with --allowed-hosts"
            )
        origin = request.headers.get("origin")
        if origin is not None and not origins.allows(origin):
            raise Forbidden(
                f"requests from the web page {origin[:100]!r} are refused; allow it with --origins"
            )
        if request.method == "OPTIONS" and request.headers.get("access-control-request-method"):
            response = Response("", status=204)
            if origin:
                response.headers["Access-Control-Allow-Origin"] = origin if not origins.any else "*"
                response.headers["Access-Control-Allow-Methods"] = CORS_METHODS
                asked = request.headers.get("access-control-request-headers")
                response.headers["Access-Control-Allow-Headers"] = asked or "authorization, content-type"
                response.headers["Access-Control-Max-Age"] = CORS_MAX_AGE
                response.headers["Vary"] = "Origin"
            return response
        if request.path not in OPEN_PATHS and not caller_has_key(settings):
            raise Unauthorized("a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)")
        content_type = request.headers.get("content-type")
        # a page may send text/plain or a form without a preflight; any other client sends no Origin
        if (
            origin is not None
            and request.method in BODY_METHODS
            and content_type
            and not is_json_type(content_type)
        ):
            raise UnsupportedMediaType(
                f"send the JSON body as application/json, not {content_type.split(';')[0][:60]!r}"
            )
        return None

    @app.after_request
    async def _cors_headers(response: Response) -> Response:
        origin = request.headers.get("origin")
        if origin and origins.allows(origin) and "Access-Control-Allow-Origin" not in response.headers:
            response.headers["Access-Control-Allow-Origin"] = origin if not origins.any else "*"
            response.headers["Vary"] = "Origin"
        return response
