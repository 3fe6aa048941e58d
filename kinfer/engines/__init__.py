"""Engines run models. `mlx` and `llama_cpp` are imported only inside their own modules (and
`kinfer.constrain`, which must load libllama before llguidance)."""
