"""One widget per module; each keeps its intrinsic style in DEFAULT_CSS."""
