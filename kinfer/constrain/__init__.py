"""Constrained decoding: structured output and forced tool calls as grammars (llguidance).

library.py: llguidance itself, loaded after libllama (the one module importing it); spec.py: the
`Constraint` a job carries; grammars.py: JSON Schema and tool-call formats as Lark text; build.py: which
constraint a request gets; runtime.py: per-row grammar state and token masks, shared by both engines.
"""
