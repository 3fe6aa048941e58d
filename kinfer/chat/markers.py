"""The one question every streaming parser here asks: could the end of this text grow into a marker?"""

from __future__ import annotations


def partial_marker_length(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (0 when none).

    That suffix must be held back: the next chunk may complete the marker.
    """
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0
