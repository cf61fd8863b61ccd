"""Token Assorted (S0) machinery: vocabulary, VQ-VAE over chunks, latent replacement.

Sequence layout (ids):  <bos> question <cot> chain <ans> answer <eos>;  the loss skips the prompt
(<bos> question <cot>). With latents, the leftmost m chain tokens become <boLatent> c_1 .. c_n <eoLatent>,
c_i the VQ-VAE codes of the chunks they replace (L/r codes per chunk).

Chunks of the chain are segments of at most L tokens that end where a word starts (`segments`): a number
or a multi-token word is never cut between latent and text, and a shorter segment is padded to L. m is a
whole number of segments, drawn per example (`draw_m`): 0 for about 1/7 of examples, otherwise up to 40%
of the chain and never into its final step.

VQ-VAE (our own, about 30 lines of quantizer: the paper's codebook and commitment losses
exactly, which vector-quantize-pytorch replaces by default with EMA codebook updates, and it would add
einops/einx as dependencies for a nearest-neighbour lookup): as in the paper, it is trained on chunks of
the whole sequence (question, chain and answer), each conditioned on the prompt, and applied to the chain
only. The encoder reads the prompt and the chunk, mean-pools each group of r chunk positions into one
vector and quantizes it against K codes; the decoder reconstructs the L tokens from L position queries
that attend to the prompt embeddings and the codes. DECISION: the paper's decoder is conditioned on one
prompt embedding vector g(prompt); ours attends to the prompt's token embeddings, a richer condition that
lets a code point at what the prompt already says instead of spelling it out. Loss = reconstruction CE
(padding left out) + ||sg(z) - e||^2 + beta ||z - sg(e)||^2. Codes unused for a while are restarted at
random encoder outputs (a standard fix for codebook collapse). Under a launch every process holds one
process's codebook: code usage is counted over every process, and a code is set from the whole batch's
encoder outputs, drawn on rank 0 (`Quantizer._draw`).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from torch import nn

from lmlab import parallel
from lmlab.errors import LmlabError
from lmlab.models.batch import pad_sequences
from lmlab.train.precision import full_precision

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


# --- VQ-VAE -----------------------------------------------------------------------------------------------

class Quantizer(nn.Module):
    def __init__(self, n_codes: int, dim: int, beta: float = 0.25):
        super().__init__()
        self.codebook = nn.Embedding(n_codes, dim)
        nn.init.uniform_(self.codebook.weight, -1 / n_codes, 1 / n_codes)
        self.beta = beta
        self.register_buffer("usage", torch.zeros(n_codes))
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool))

    def forward(self, z: torch.Tensor):
        """Nearest codes in float32 whatever the autocast: under bf16 the squared distances of nearby codes tie
        and the codebook (a float32 parameter) would be written from bf16 values."""
        with full_precision(z.device):
            return self._quantize(z.float())

    def _quantize(self, z: torch.Tensor):
        flat = z.reshape(-1, z.shape[-1])
        if self.training and not bool(self.initialized):  # codes start at encoder outputs, not near 0 where
            self._draw(z, torch.arange(len(self.usage), device=z.device))  # one code would win every chunk
            self.initialized.fill_(True)
        dist = (flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codebook.weight.T
                + self.codebook.weight.pow(2).sum(1)[None])
        idx = dist.argmin(1)
        e = self.codebook(idx).view_as(z)
        codebook_loss = (z.detach() - e).pow(2).mean()
        commitment = (z - e.detach()).pow(2).mean()
        if self.training:
            counts = torch.bincount(idx, minlength=len(self.usage)).to(self.usage.dtype)
            self.usage.mul_(0.99).add_(parallel.sum_(counts))  # the codes every process's slice used
        quantized = z + (e - z).detach()  # straight-through
        return quantized, idx.view(z.shape[:-1]), codebook_loss + self.beta * commitment

    @torch.no_grad()
    def restart_dead(self, z: torch.Tensor, threshold: float = 0.05) -> int:
        dead = (self.usage < threshold).nonzero()[:, 0]
        if len(dead) == 0:
            return 0
        self._draw(z, dead)
        self.usage[dead] = 1.0
        return len(dead)

    @torch.no_grad()
    def _draw(self, z: torch.Tensor, codes: torch.Tensor) -> None:
        """Codes `codes` set to random encoder outputs of the batch (a little noise added). Under a launch z is
        this process's slice: the outputs are gathered in the global batch's order and rank 0 draws (its random
        stream is one process's), so every process holds one process's codebook."""
        flat = parallel.gather_batch(z.detach()).reshape(-1, z.shape[-1])
        if parallel.is_main():
            pick = flat[torch.randint(len(flat), (len(codes),), device=flat.device)]
            weight = self.codebook.weight  # written in its own dtype (z may come from a bf16 autocast region)
            weight[codes] = (pick + 0.01 * torch.randn_like(pick)).to(weight.dtype)
        parallel.from_main(self.codebook.weight.data)


class ChunkVQVAE(nn.Module):
    def __init__(self, vocab_size: int, chunk: int, rate: int, n_codes: int, dim: int = 64, layers: int = 2,
                 heads: int = 4, max_prompt: int = 96, pad_id: int = -100, max_offset: int = 0):
        super().__init__()
        # where the chunk sits in the sequence (its first token's position), added to the chunk's tokens and to
        # the decoder's queries: a chunk's words depend on how far the trace has got
        self.where = nn.Embedding(max_offset + 1, dim) if max_offset else None
        self.pad_id = pad_id  # padding inside a chunk (a segment shorter than the chunk) is not reconstructed
        if chunk % rate:
            raise LmlabError(f"rate {rate} does not divide the chunk length {chunk}")
        self.chunk, self.rate, self.n_codes = chunk, rate, n_codes
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_prompt + chunk, dim)
        self.kind = nn.Embedding(3, dim)  # prompt / chunk / code
        enc = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(enc, layers, enable_nested_tensor=False)
        self.to_code = nn.Linear(dim, dim)
        self.quantizer = Quantizer(n_codes, dim)
        self.queries = nn.Parameter(torch.randn(chunk, dim) * 0.02)
        dec = nn.TransformerDecoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(dec, layers)
        self.out = nn.Linear(dim, vocab_size)
        self.max_prompt = max_prompt

    def _prompt(self, prompt: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        positions = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)  # counted from the first real token (left-padded)
        return self.embed(prompt) + self.pos(positions) + self.kind.weight[0]

    def _where(self, offset, like: torch.Tensor):
        if self.where is None or offset is None:
            return 0
        return self.where(offset.clamp(max=self.where.num_embeddings - 1).to(like.device))[:, None]

    def encode(self, prompt, prompt_mask, chunk_ids, offset=None):
        """-> (B, chunk/rate) code indices, the quantized vectors and the VQ loss."""
        if prompt.shape[1] > self.max_prompt:
            raise LmlabError(f"a prompt of {prompt.shape[1]} tokens exceeds the VQ-VAE's {self.max_prompt}")
        p = self._prompt(prompt, prompt_mask)
        positions = torch.arange(self.max_prompt, self.max_prompt + self.chunk, device=prompt.device)
        c = self.embed(chunk_ids) + self.pos(positions)[None] + self.kind.weight[1] + self._where(offset, chunk_ids)
        pad = torch.cat([~prompt_mask, torch.zeros_like(chunk_ids, dtype=torch.bool)], 1)
        h = self.encoder(torch.cat([p, c], 1), src_key_padding_mask=pad)[:, prompt.shape[1]:]
        pooled = h.view(h.shape[0], self.chunk // self.rate, self.rate, -1).mean(2)
        z = self.to_code(pooled)
        quantized, idx, vq_loss = self.quantizer(z)
        return idx, quantized, vq_loss, z

    def decode(self, prompt, prompt_mask, quantized, offset=None):
        memory = torch.cat([self._prompt(prompt, prompt_mask), quantized + self.kind.weight[2]], 1)
        mem_pad = torch.cat([~prompt_mask, torch.zeros(quantized.shape[:2], dtype=torch.bool,
                                                        device=quantized.device)], 1)
        q = self.queries[None].expand(prompt.shape[0], -1, -1) + self._where(offset, quantized)
        return self.out(self.decoder(q, memory, memory_key_padding_mask=mem_pad))

    def forward(self, prompt, prompt_mask, chunk_ids, offset=None):
        idx, quantized, vq_loss, z = self.encode(prompt, prompt_mask, chunk_ids, offset)
        logits = self.decode(prompt, prompt_mask, quantized, offset)
        rec = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk_ids.reshape(-1),
                                          ignore_index=self.pad_id)
        return rec + vq_loss, rec, vq_loss, logits, idx, z

    @torch.no_grad()
    def codes(self, prompt, prompt_mask, chunk_ids, offset=None) -> torch.Tensor:
        self.eval()
        return self.encode(prompt, prompt_mask, chunk_ids, offset)[0]

    @torch.no_grad()
    def reconstruct(self, prompt, prompt_mask, chunk_ids, offset=None) -> torch.Tensor:
        self.eval()
        _, quantized, _, _ = self.encode(prompt, prompt_mask, chunk_ids, offset)
        return self.decode(prompt, prompt_mask, quantized, offset).argmax(-1)


def pad_left(seqs: list[list[int]], pad: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and a boolean mask of the real tokens, on `device` (None: the host)."""
    batch = pad_sequences(seqs, pad, side="left", device=device)
    return batch["input_ids"], batch["attention_mask"].bool()
