"""Prompts of about N tokens: seeded filler text, sized by a ratio the server's own usage calibrates.

Every request gets its own seed, so no two prompts share more than the chat template's preamble and a
server's prefix cache cannot turn the sweep into a cache benchmark. The real prompt sizes are always
read back from usage; the ratio only aims.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# Common words that most BPE vocabularies hold as one token with a leading space.
_WORD_TEXT = (
    "the of and to in is was for that with as on by at from his her they this had not are but "
    "which have one you were all their there been has when who will more would can if out so "
    "about what up said into some them could time these two may then first any new like only "
    "over such our most other where after back also just well way many down even good very "
    "through year work long little great make must should still life part place old much "
    "every world day each people know take while small last under never house water "
    "found left point here same hand light night food land city tree river road paper stone "
    "music table window garden morning summer winter market letter story field ship train "
    "green blue white black red open close early late short north south east west common "
    "simple quick slow warm cold bright clear quiet strong sound voice friend family school "
    "village mountain valley island forest bridge castle kitchen doctor teacher farmer"
)
WORDS = tuple(_WORD_TEXT.split())

DEFAULT_TOKENS_PER_WORD = 1.1  # used until a server's usage calibrates it
DEFAULT_OVERHEAD = 30  # chat-template tokens around the user's text


def filler(words: int, seed: int) -> str:
    """`words` seeded words, with a period every dozen so tokenizers see sentence-like text."""
    rng = random.Random(seed)
    out = []
    for i in range(words):
        word = rng.choice(WORDS)
        out.append(word + ("." if i % 12 == 11 else ""))
    return " ".join(out)


def prompt_text(words: int, seed: int) -> str:
    """A user message of about `words` + 3 words that starts differently for every seed."""
    return f"Note {seed}: {filler(words, seed)}"


@dataclass(frozen=True)
class PromptSizer:
    """Maps a wanted prompt size (tokens, template included) to a number of filler words."""

    tokens_per_word: float = DEFAULT_TOKENS_PER_WORD
    overhead: float = DEFAULT_OVERHEAD
    calibrated: bool = False

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.tokens_per_word))

    def estimate(self, words: int) -> int:
        """Prompt tokens expected for `words` filler words (for servers that report no usage)."""
        return round(self.overhead + self.tokens_per_word * words)


def fit_sizer(samples: Sequence[tuple[int, int]]) -> PromptSizer:
    """Least-squares line through (filler words, prompt tokens) samples from the server's usage."""
    if len(samples) < 2 or len({w for w, _ in samples}) < 2:
        raise ValueError("need samples at two different sizes to calibrate")
    n = len(samples)
    mean_w = sum(w for w, _ in samples) / n
    mean_t = sum(t for _, t in samples) / n
    var = sum((w - mean_w) ** 2 for w, _ in samples)
    slope = sum((w - mean_w) * (t - mean_t) for w, t in samples) / var
    if slope <= 0:
        raise ValueError(f"prompt tokens do not grow with the text ({samples})")
    return PromptSizer(tokens_per_word=slope, overhead=mean_t - slope * mean_w, calibrated=True)
