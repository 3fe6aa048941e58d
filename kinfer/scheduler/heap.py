"""Keep the garbage collector's full passes short while replies stream.

CPython's cyclic collector, on its oldest generation, walks every tracked container alive: once a model
has loaded, that is the server's modules, the model's module tree, its tokenizer and chat template. On
this 2-core VM a full pass over ~123,000 such objects took 88 ms (measured in the server with the tiny
qwen3 beside a 20,000-token prompt), on whichever thread allocated next: often the engine thread
mid-step, and every streaming reply waits (the H200 host showed 35 ms build spikes late in a long
prompt). What is alive once a model has loaded lives as long as that model, so `settle` freezes it
(`gc.freeze`: the collector skips it from then on) and later passes walk only what came after. After an
unload it thaws everything first and collects, so an unloaded model's own reference cycles (its MLX
arrays among them) cannot outlive it, then freezes what remains. One settle is a full collection:
tens of milliseconds, at a load or an unload, not mid-stream.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Collect what is garbage now and freeze what is left (see the module doc). Called on the event
    loop, after a load and after an unload."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
