"""The HTTP edge: the Quart app over a `Runtime`, and serving it.

    app = create_app(runtime)               # app.py: the dialects, /health, /metrics, /openapi.json
    await serve(runtime, sock, shutdown)    # http.py: Hypercorn on a socket bound beforehand

A dialect is a module of routes (`openai_chat`, `ollama`, `anthropic`, `responses`) with helpers named
after it: wire schemas and their translation to `ChatRequest` (`<name>_wire`), rendering and state
(`responses_render`, `responses_store`). Each ends with `DIALECT = Dialect(...)` (`dialect.py`);
`dialects.DIALECTS` is the one list the app registers, routes errors by and documents. No dialect
imports another. Shared by all: `wire` (lenient base model, body parsing), `streaming` (SSE, NDJSON),
`access` (API key, CORS), `context` (the app's runtime), `openapi`.
"""
