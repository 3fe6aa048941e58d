"""Serving one model sharded across ranks with MLX's distributed layer (`mx.distributed`).

Rank 0 runs the HTTP server, the scheduler and every decision; each step it broadcasts a small plan
(jobs admitted, cancelled, prompt room) that the other ranks replay on their replica of the engine, so
the same batched passes run everywhere and the tensor-parallel all-reduces inside the model line up.
See docs/distributed.md.
"""
