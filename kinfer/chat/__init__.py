"""Model-facing text: chat templates, think mode, the streaming think splitter, tool-call parsing.

Input side: `template.render_prompt` (Jinja chat templates, sandboxed), `go_template.render_go_template`
(Ollama's `template` field), `volatile.strip_volatile_headers`. Output side: `pipeline.OutputPipeline`,
built from the `TemplateTraits` and `starts_in_thinking` that `render_prompt` returns. Import names
from their defining modules; this package re-exports nothing.
"""
