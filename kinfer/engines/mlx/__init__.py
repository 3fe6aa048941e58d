"""The MLX engine's wing: a Hugging Face safetensors directory served on MLX.

Importing any module of this package first runs `blas`, which must happen before the first
`import mlx` (it preloads OpenBLAS so MLX binds its BLAS symbols to it; see blas.py). That is why
this file imports it, and why no module here repeats the import.
"""

from kinfer.engines.mlx import blas  # noqa: F401  (before the first `import mlx`)
