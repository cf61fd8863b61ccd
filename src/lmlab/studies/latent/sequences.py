"""latent's sequences: the vocabulary, the example layout and the latent replacement (Token Assorted).

Sequence layout (ids):  <bos> question <cot> chain <ans> answer <eos>;  the loss skips the prompt
(<bos> question <cot>). With latents, the leftmost m chain tokens become <boLatent> c_1 .. c_n <eoLatent>,
c_i the VQ-VAE codes of the chunks they replace (L/r codes per chunk).

Chunks of the chain are segments of at most L tokens that end where a word starts (`segments`): a number
or a multi-token word is never cut between latent and text, and a shorter segment is padded to L. m is a
whole number of segments, drawn per example (`draw_m`): 0 for about 1/7 of examples, otherwise up to 40%
of the chain and never into its final step.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from lmlab.errors import LmlabError
from lmlab.models.batch import pad_sequences

SPECIALS = ["<pad>", "<bos>", "<eos>", "<cot>", "<ans>"]
LATENT_MARKS = ["<boLatent>", "<eoLatent>"]
_TOKEN = re.compile(r"\d|[A-Za-z]+|[^\sA-Za-z\d]")


_INT = re.compile(r"-?\d+")


class _LatentIds(ABC):
    """What both vocabularies share: code ids and reading the answer back."""

    first_code: int
    n_codes: int
    ans: int

    def code(self, c: int) -> int:
        return self.first_code + int(c)

    def is_code(self, i: int) -> bool:
        return self.first_code <= i < self.first_code + self.n_codes

    @abstractmethod
    def answer_text(self, ids: list[int]) -> str:
        """The text of generated ids after <ans>, codes and padding left out."""

    def answer_after(self, generated: list[int]) -> str | None:
        """The answer text after the last <ans> in generated ids, or None without one."""
        if self.ans not in generated:
            return None
        return self.answer_text(generated[len(generated) - generated[::-1].index(self.ans):])

    def parse_answer(self, generated: list[int]) -> int | None:
        """The integer after the last <ans> in generated ids, or None."""
        text = self.answer_after(generated)
        found = _INT.match(text.strip().replace(",", "")) if text is not None else None
        return int(found.group()) if found else None


class Vocab(_LatentIds):
    """Word-level vocabulary for the from-scratch model (digits are single tokens), plus K latent codes."""

    def __init__(self, words: list[str], n_codes: int):
        self.base = SPECIALS + sorted(set(words) - set(SPECIALS))
        self.n_base = len(self.base)
        self.n_codes = n_codes
        self.tokens = self.base + LATENT_MARKS + [f"<code_{i}>" for i in range(n_codes)]
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.pad, self.bos, self.eos, self.cot, self.ans = (self.index[t] for t in SPECIALS)
        self.bo_latent, self.eo_latent = self.index["<boLatent>"], self.index["<eoLatent>"]
        self.first_code = self.index["<code_0>"]

    @classmethod
    def from_texts(cls, texts, n_codes: int) -> "Vocab":
        words = {w for t in texts for w in _TOKEN.findall(t)} | {str(d) for d in range(10)}
        return cls(sorted(words), n_codes)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        out = []
        for w in _TOKEN.findall(text):
            if w not in self.index:
                raise LmlabError(f"the word {w!r} is not in the vocabulary (built from the training problems)")
            out.append(self.index[w])
        return out

    def decode(self, ids) -> str:
        return " ".join(self.tokens[i] for i in ids)

    def answer_text(self, ids: list[int]) -> str:
        return "".join(self.tokens[t] for t in ids if not self.is_code(t) and t not in (self.eos, self.pad))


class TokenizerVocab(_LatentIds):
    """The same interface over a pretrained model's tokenizer (the SmolLM2 option): the markers <cot>,
    <ans>, <boLatent>, <eoLatent> and K codes are added as special tokens (the model's embeddings must be
    resized to len(vocab)); <bos>, <eos> and <pad> are the tokenizer's own."""

    def __init__(self, tokenizer, n_codes: int):
        import copy

        self.tokenizer = copy.deepcopy(tokenizer)  # never grow the loaded model's own tokenizer
        added = ["<cot>", "<ans>"] + LATENT_MARKS + [f"<code_{i}>" for i in range(n_codes)]
        self.tokenizer.add_tokens(added, special_tokens=True)
        ids = self.tokenizer.convert_tokens_to_ids(added)
        if len(set(ids)) != len(added):
            raise LmlabError("the tokenizer did not accept the latent marker tokens as new tokens")
        self.cot, self.ans, self.bo_latent, self.eo_latent = ids[:4]
        self.first_code, self.n_codes = ids[4], n_codes
        if ids[4:] != list(range(ids[4], ids[4] + n_codes)):
            raise LmlabError("the tokenizer gave the latent codes non-consecutive ids")
        self.eos = self.tokenizer.eos_token_id
        if self.eos is None:
            raise LmlabError("the tokenizer has no end-of-sequence token")
        self.bos = self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.eos
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def answer_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class Example:
    prompt: list[int]  # <bos> question <cot>
    chain: list[int]
    answer: list[int]  # <ans> answer <eos>
    value: int | str  # the expected answer (an int is compared as a number)
    starts: list[int] = field(default_factory=list)  # chain token index where each word starts
    computed: list[bool] = field(default_factory=list)  # per chain token: a value a step computes
    last_step: int = 0  # chain token index where the final step starts (never replaced by latents)
    step_starts: list[int] = field(default_factory=list)  # chain token index where each step starts


_DIGITS = re.compile(r"\d+")


def computed_words(question: str, words: list[str]) -> list[int]:
    """Without labels from the generator: a chain word is computed when it holds a number that is neither in
    the question nor earlier in the chain (a result); everything else counts as copied."""
    seen = set(_DIGITS.findall(question))
    out = []
    for i, w in enumerate(words):
        numbers = _DIGITS.findall(w)
        if numbers and any(n not in seen for n in numbers):
            out.append(i)
        seen.update(numbers)
    return out


def make_example(vocab, problem) -> Example:
    """Token ids of a problem; the chain is encoded word by word so that latent chunks can end at word starts
    (a chunk boundary never splits a number or a multi-token word)."""
    words = problem.chain.split()
    chain, starts, word_of = [], [], []
    for i, w in enumerate(words):
        ids = vocab.encode(" " + w)
        starts.append(len(chain))
        chain += ids
        word_of += [i] * len(ids)
    labelled = getattr(problem, "computed", None)
    hot = set(labelled if labelled else computed_words(problem.question, words))
    step_words, at = [], 0
    for step in problem.steps:  # where each step starts among the chain's words ("23 + 14 = 37" reads "... 37 .")
        n = len(step.split())
        if at >= len(words):
            break
        step_words.append(at)
        at += n + (1 if words[at + n:at + n + 1] == ["."] and not step.split()[-1:] == ["."] else 0)
    step_starts = [starts[w] for w in step_words] or [0]
    return Example([vocab.bos] + vocab.encode(problem.question) + [vocab.cot], chain,
                   [vocab.ans] + vocab.encode(" " + str(problem.answer)) + [vocab.eos], problem.answer,
                   starts, [word_of[t] in hot for t in range(len(chain))], step_starts[-1], step_starts)


def is_correct(vocab, generated: list[int], value) -> bool:
    """An int answer is read as a number (the last <ans>, commas dropped); any other answer must equal the
    generated answer text, whitespace ignored."""
    if isinstance(value, int):
        return vocab.parse_answer(generated) == value
    text = vocab.answer_after(generated)
    return text is not None and "".join(text.split()) == "".join(str(value).split())


def segments(ex: Example, chunk: int) -> list[tuple[int, int]]:
    """The chain cut into consecutive segments of at most `chunk` tokens, each one VQ-VAE chunk (padded to
    `chunk`): whole steps where they fit (several short steps share a chunk), a step longer than a chunk
    cut where a word starts. A cut never falls inside a word (a number, a multi-token name) unless one word
    is longer than a chunk, and a chunk that fits ends where a step ends, so text resumes at a step."""
    starts = ex.starts or list(range(len(ex.chain)))
    steps = [s for s in (ex.step_starts or [0]) if s < len(ex.chain)] or [0]
    units = []  # (begin, end) pieces: a step, or a word-aligned piece of a long step
    for a, b in zip(steps, steps[1:] + [len(ex.chain)]):
        if b - a <= chunk:
            units.append((a, b))
            continue
        begin, end = a, a
        for w in [s for s in starts if a < s <= b] + ([b] if b not in starts else []):
            if w - begin > chunk:
                if end > begin:
                    units.append((begin, end))
                    begin = end
                while w - begin > chunk:
                    units.append((begin, begin + chunk))
                    begin += chunk
            end = w
        if end > begin:
            units.append((begin, end))
    out: list[tuple[int, int]] = []
    for a, b in units:  # short whole steps share a chunk
        if out and b - out[-1][0] <= chunk and out[-1][1] == a and (a in steps):
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


MAX_REPLACED = 0.4  # the paper's largest m, 256 of a ~640-token trace


def replacement_options(ex: Example, chunk: int) -> list[int]:
    """The m values (chain tokens replaced) a training example allows, besides 0: whole segments from the
    left, never reaching the final step and never more than 40% of the chain (the paper's set {0, 72, ..., 256}
    on traces of about 640 tokens: a fifth on average, 40% at most; replacing all of it is its All-Replace
    ablation, which collapses)."""
    limit = min(ex.last_step, int(MAX_REPLACED * len(ex.chain)))
    return [e for _, e in segments(ex, chunk) if e <= limit]


def draw_m(rng, ex: Example, chunk: int) -> int:
    """m = 0 for about 1/7 of examples (the paper's set {0, 72, 128, ..., 256} has seven values), else one
    of the allowed segment ends, uniformly."""
    options = replacement_options(ex, chunk)
    if not options or rng.random() < 1 / 7:
        return 0
    return rng.choice(options)


def codes_needed(ex: Example, m: int, chunk: int, rate: int) -> int:
    """Codes that replace the first m chain tokens: chunk / rate per segment."""
    return sum(1 for _, e in segments(ex, chunk) if e <= m) * (chunk // rate)


PLACEBO_CODE = 0  # the one code of the placebo (`--placebo`): any code would do, none carries anything


def carry_nothing(codes: list[int]) -> list[int]:
    """The placebo's codes: as many as `codes`, each the one constant code, so that the layout (m, the codes between
    the markers) is the study's and the codes say nothing about the chunks they replace."""
    return [PLACEBO_CODE] * len(codes)


def constant_prefix(vocab, prefix: list[int]) -> list[int]:
    """A forced prefix with every code in it the one constant code (the same m and number of codes): what the
    model reads when the codes carry nothing."""
    return [vocab.code(PLACEBO_CODE) if vocab.is_code(t) else t for t in prefix]


def replace_with_latents(vocab, chain: list[int], codes: list[int], m: int, n_codes: int) -> list[int]:
    """<boLatent> n_codes codes <eoLatent> in place of the first m chain tokens, then the rest of the chain as
    text (m = 0: the chain)."""
    if m == 0:
        return list(chain)
    if not 0 < m <= len(chain):
        raise LmlabError(f"m = {m} is outside a {len(chain)}-token chain")
    if n_codes < 1 or len(codes) < n_codes:
        raise LmlabError(f"{n_codes} codes are needed for m = {m}, got {len(codes)}")
    return [vocab.bo_latent] + [vocab.code(c) for c in codes[:n_codes]] + [vocab.eo_latent] + list(chain[m:])


def pad_left(seqs: list[list[int]], pad: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and a boolean mask of the real tokens, on `device` (None: the host)."""
    batch = pad_sequences(seqs, pad, side="left", device=device)
    return batch["input_ids"], batch["attention_mask"].bool()
