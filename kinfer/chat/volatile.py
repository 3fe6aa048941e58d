"""Remove per-request noise that clients put at the very start of the prompt.

Claude Code (>= 2.1) sends, as the first system block of every request, a line like::

    x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch=eb6c6;

`cch` is a hash that changes on every request. Sitting in front of the whole system prompt and the
tool list, it makes every turn's prompt differ from the last at about token 40, so the prefix cache
never hits (vLLM-MLX #277, SGLang #21064 and llama.cpp #21793 strip it for the same reason).
"""

from __future__ import annotations

import re

# Only on a line that starts with the header's name: the same text elsewhere is the user's business.
_CCH_RE = re.compile(
    r"^(?P<head>x-anthropic-billing-header:[^\n]*?)[ \t]*\bcch=[0-9A-Fa-f]*;?",
    re.MULTILINE | re.IGNORECASE,
)


def strip_volatile_headers(text: str) -> str:
    """`text` with the `cch=<hex>;` value of Claude Code's billing header line removed.

    The rest of the line (`cc_version`, `cc_entrypoint`) is stable within a session and is kept.
    """
    if "cch=" not in text:
        return text
    return _CCH_RE.sub(lambda m: m.group("head"), text)
