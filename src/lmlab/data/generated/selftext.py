"""Training text without a hub: what the model itself writes, plus docstrings from Python's stdlib.

The sparse-circuits study's constraint is "cross-entropy no worse than the dense model's", so the natural data is
the dense model's own distribution: sequences it samples (temperature 1, no top-k/top-p) from short, varied openers.
The Docstring task benefits from real docstrings, and Python's standard library (always installed) has thousands:
`stdlib_docstrings` renders `def name(args):` plus the docstring, read with `ast` (no import, no execution).
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

import torch

OPENERS = ["The", "In", "Once upon a time", "def ", "import ", "My", "Today", "A new study", "Python", "When",
           "She", "We", "It is", "Here is", "According to", "class ", "The best way to", "How to", "1.", "Dear"]


@torch.no_grad()
def sample_text(lm, n: int, new_tokens: int = 48, seed: int = 0, batch_size: int = 32,
                exact: bool = False) -> list[list[int]]:
    """`n` sequences (opener + sampled continuation, as token ids), the same for the same seed.
    `exact`: every continuation is `new_tokens` long (end-of-sequence is not sampled before that)."""
    gen = torch.Generator().manual_seed(seed)
    out: list[list[int]] = []
    pad = lm.tokenizer.pad_token_id
    for start in range(0, n, batch_size):
        k = min(batch_size, n - start)
        openers = [OPENERS[int(i)] for i in torch.randint(len(OPENERS), (k,), generator=gen, device="cpu")]
        enc = lm.encode(openers, position_ids=False)
        torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=gen, device="cpu")))
        ids = lm.model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=new_tokens, pad_token_id=pad,
                                **({"min_new_tokens": new_tokens} if exact else {}))
        width = enc["input_ids"].shape[1]
        for row, mask in zip(ids, enc["attention_mask"]):
            prompt = row[:width][mask.bool()].tolist()
            cont = row[width:].tolist()
            while cont and cont[-1] == pad:  # finished early: drop the padding generate appended
                cont.pop()
            out.append(prompt + cont)
    return out


def stdlib_docstrings(tokenizer, n: int, max_tokens: int = 64, seed: int = 0) -> list[list[int]]:
    """`n` function signatures with their docstrings from the standard library, as token ids."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))
    random.Random(seed).shuffle(files)
    texts: list[str] = []
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and len(node.args.args) >= 2:
                args = ", ".join(a.arg for a in node.args.args)
                doc = ast.get_docstring(node).strip().replace('"""', "'''")
                texts.append(f'def {node.name}({args}):\n    """{doc}\n    """')
        if len(texts) >= 4 * n:
            break
    random.Random(seed + 1).shuffle(texts)
    return [tokenizer(t)["input_ids"][:max_tokens] for t in texts[:n]]
