"""App factory: one blueprint per dialect, plus health and metrics; errors in the caller's dialect."""

from __future__ import annotations

import logging

from quart import Quart, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from kinfer import __version__
from kinfer.errors import InvalidRequest, KinferError, RequestTooLarge, RouteNotFound
from kinfer.metrics import render
from kinfer.runtime import Runtime
from kinfer.server.access import caller_has_key, install_access_control
from kinfer.server.access_log import install_request_log
from kinfer.server.dialects import DIALECTS, dialect_for
from kinfer.server.openapi import openapi_spec

log = logging.getLogger(__name__)


def create_app(runtime: Runtime) -> Quart:
    """The Quart app over `runtime`: each dialect's blueprint, /health, /metrics and /openapi.json."""
    app = Quart("kinfer")
    app.extensions["kinfer"] = runtime
    app.config["MAX_CONTENT_LENGTH"] = int(runtime.settings.max_body_mb * 1024 * 1024)
    app.config["BODY_TIMEOUT"] = 120
    install_access_control(app, runtime.settings)
    install_request_log(app, runtime.scheduler, runtime.requests)
    for dialect in DIALECTS:
        app.register_blueprint(dialect.blueprint)

    def render_error(error: KinferError) -> Response:
        return dialect_for(request.path).error_response(error)

    @app.errorhandler(KinferError)
    async def _kinfer_error(error: KinferError) -> Response:
        return render_error(error)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if status == 404:
            wrapped: KinferError = RouteNotFound(f"no route {request.method} {request.path}")
        elif status == 413:
            wrapped = RequestTooLarge(f"the request body is larger than {runtime.settings.max_body_mb:g} MiB")
        else:
            wrapped = InvalidRequest(error.description or error.name)
            wrapped.status = status
        return render_error(wrapped)

    @app.errorhandler(Exception)
    async def _unexpected(error: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        failure = KinferError(f"internal error: {type(error).__name__}: {error}")
        return render_error(failure)

    @app.get("/health")
    async def health() -> Response:
        cluster = runtime.cluster.status() if runtime.cluster is not None else None
        if cluster is not None and cluster["error"]:  # a rank lost: serving is over until a restart
            body = {"status": "rank lost"}
            if caller_has_key(runtime.settings):
                body.update(version=__version__, distributed=cluster)
            reply = jsonify(body)
            reply.status_code = 503
            return reply
        if not caller_has_key(runtime.settings):
            return jsonify({"status": "ok"})  # open to all: which models run is the key holder's business
        loaded = [m.name for m in runtime.scheduler.loaded_models()]
        if cluster is not None:
            return jsonify({"status": "ok", "version": __version__, "loaded": loaded, "distributed": cluster})
        if runtime.scheduler.draining:  # a load balancer stops sending work here
            reply = jsonify({"status": "shutting down", "version": __version__, "loaded": loaded})
            reply.status_code = 503
            return reply
        return jsonify({"status": "ok", "version": __version__, "loaded": loaded})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = render(runtime.metrics_registry) if runtime.metrics_registry else b""
        return Response(body, mimetype="text/plain; version=0.0.4")

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        # built on first use: every blueprint is registered by then, and the spec never changes after
        if "kinfer.openapi" not in app.extensions:
            app.extensions["kinfer.openapi"] = openapi_spec(app)
        return jsonify(app.extensions["kinfer.openapi"])

    return app
