"""What a decoder's verdict adds to the encoder study's: perplexity on the held-out text the teacher sampled, the
mean over replicates per width and budget (the claims, the intervals and the figure's task panels are the encoder
study's own code, since the decoder's rows have their shape)."""

from __future__ import annotations


def perplexities(result) -> dict[str, float]:
    """{"teacher" or "<bits>-bit <budget>": mean perplexity}; empty for a run without `lm` rows (an encoder)."""
    lm = result.table("lm")
    if not len(lm):
        return {}
    mean = lm.groupby(["bits", "budget"], sort=False).perplexity.mean()
    return {f"{int(b)}-bit {g}" if b < 32 else "teacher": round(float(v), 3) for (b, g), v in mean.items()}
