"""latent's VQ-VAE over chunks of a sequence (sequences.py lays the chunks out and says how they are cut).

VQ-VAE (our own, about 30 lines of quantizer: the paper's codebook and commitment losses
exactly, which vector-quantize-pytorch replaces by default with EMA codebook updates, and it would add
einops/einx as dependencies for a nearest-neighbour lookup): as in the paper, it is trained on chunks of
the whole sequence (question, chain and answer) and applied to the chain only. As the paper's notation has it, the
encoder f_enc reads a chunk of L text tokens alone (and where the chunk sits in the sequence), mean-pools each group
of r chunk positions into one vector and quantizes it against K codes; the decoder f_dec reconstructs the L tokens
from L position queries that attend to the L/r codes and to one prompt embedding g(prompt), a d-dimensional vector
(here: the prompt's tokens through one transformer layer, mean-pooled over the real tokens). DECISION (revised to
follow the paper): an earlier version let the encoder read the prompt and the decoder attend to every prompt token;
a decoder that can look the walk up in the prompt leaves the codes little to carry, and on the turtle walk a model
read its true codes no better than one constant code. With one pooled prompt vector, what a chunk computes must
travel in its codes. Loss = reconstruction CE (padding left out) + ||sg(z) - e||^2 + beta ||z - sg(e)||^2. Codes
unused for a while are restarted at random encoder outputs (a standard fix for codebook collapse). Under a launch
every process holds one process's codebook: code usage is counted over every process, and a code is set from the
whole batch's encoder outputs, drawn on rank 0 (`Quantizer._draw`).
"""

from __future__ import annotations

import torch
from torch import nn

from lmlab import parallel
from lmlab.errors import LmlabError
from lmlab.train.precision import full_precision

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
        self.prompt_encoder = nn.TransformerEncoder(enc, 1, enable_nested_tensor=False)  # g: the prompt -> one vector
        self.to_prompt = nn.Linear(dim, dim)
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

    def prompt_vector(self, prompt: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """g(prompt): (B, 1, dim), the prompt's tokens through one layer, mean-pooled over its real tokens."""
        if prompt.shape[1] > self.max_prompt:
            raise LmlabError(f"a prompt of {prompt.shape[1]} tokens exceeds the VQ-VAE's {self.max_prompt}")
        h = self.prompt_encoder(self._prompt(prompt, prompt_mask), src_key_padding_mask=~prompt_mask)
        weights = prompt_mask.to(h.dtype)[..., None]
        return self.to_prompt((h * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True).clamp(min=1))

    def _where(self, offset, like: torch.Tensor):
        if self.where is None or offset is None:
            return 0
        return self.where(offset.clamp(max=self.where.num_embeddings - 1).to(like.device))[:, None]

    def encode(self, chunk_ids, offset=None):
        """-> (B, chunk/rate) code indices, the quantized vectors, the VQ loss and the encoder's outputs. The encoder
        reads the chunk alone (the paper's f_enc); the prompt is only the decoder's condition."""
        positions = torch.arange(self.max_prompt, self.max_prompt + self.chunk, device=chunk_ids.device)
        c = self.embed(chunk_ids) + self.pos(positions)[None] + self.kind.weight[1] + self._where(offset, chunk_ids)
        h = self.encoder(c)
        pooled = h.view(h.shape[0], self.chunk // self.rate, self.rate, -1).mean(2)
        z = self.to_code(pooled)
        quantized, idx, vq_loss = self.quantizer(z)
        return idx, quantized, vq_loss, z

    def decode(self, prompt, prompt_mask, quantized, offset=None):
        """The chunk's logits from its codes and g(prompt) (the paper's f_dec)."""
        memory = torch.cat([self.prompt_vector(prompt, prompt_mask), quantized + self.kind.weight[2]], 1)
        q = self.queries[None].expand(prompt.shape[0], -1, -1) + self._where(offset, quantized)
        return self.out(self.decoder(q, memory))

    def forward(self, prompt, prompt_mask, chunk_ids, offset=None):
        idx, quantized, vq_loss, z = self.encode(chunk_ids, offset)
        logits = self.decode(prompt, prompt_mask, quantized, offset)
        rec = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk_ids.reshape(-1),
                                          ignore_index=self.pad_id)
        return rec + vq_loss, rec, vq_loss, logits, idx, z

    @torch.no_grad()
    def codes(self, chunk_ids, offset=None) -> torch.Tensor:
        self.eval()
        return self.encode(chunk_ids, offset)[0]

    @torch.no_grad()
    def reconstruct(self, prompt, prompt_mask, chunk_ids, offset=None) -> torch.Tensor:
        self.eval()
        _, quantized, _, _ = self.encode(chunk_ids, offset)
        return self.decode(prompt, prompt_mask, quantized, offset).argmax(-1)
