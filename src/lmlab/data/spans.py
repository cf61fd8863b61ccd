"""Character spans of a text -> the token positions that cover them, exactly.

Uses the fast tokenizer's offset mapping, so it is right for byte-level BPE (GPT-2, SmolLM2),
WordPiece and SentencePiece alike. A span that no token covers is an error, never a silent
mis-alignment.
"""

from __future__ import annotations

from lmlab.errors import LmlabError


def token_positions(tokenizer, text: str, start: int, end: int, add_special_tokens: bool = True) -> list[int]:
    """Positions (in `tokenizer(text)`) of the tokens overlapping characters [start, end)."""
    if not 0 <= start < end <= len(text):
        raise LmlabError(f"character span [{start}, {end}) is outside a text of {len(text)} characters")
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=add_special_tokens)
    positions = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < end and b > start]
    if not positions:
        raise LmlabError(f"no token covers {text[start:end]!r} in the tokenized prompt")
    return positions


def find_span(tokenizer, text: str, needle: str, add_special_tokens: bool = True, occurrence: int = -1) -> list[int]:
    """Token positions of `needle` in `text` (the last occurrence by default)."""
    starts = [i for i in range(len(text)) if text.startswith(needle, i)] if needle else []
    if not starts:
        raise LmlabError(f"{needle!r} does not occur in the prompt {text!r}")
    start = starts[occurrence]
    return token_positions(tokenizer, text, start, start + len(needle), add_special_tokens)
