"""The Quart app: one module per dialect, each a pure translator to and from ChatRequest and events."""
