"""Tiny randomly initialised models with in-process tokenizers, for tests and quick logic checks.

Built from a config in a fraction of a second, the same weights for the same seed, no files.
`tiny-llama` uses grouped-query attention (4 query heads, 2 KV heads) so that code paths that must
repeat K/V per head group are exercised; `tiny-gpt2` has GPT-2's fused Conv1D projections;
`tiny-bert` is a bidirectional encoder.
"""

from __future__ import annotations

import itertools
from collections import Counter
from functools import lru_cache

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (AutoModel, AutoModelForSequenceClassification, BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

from lmlab.models.catalog import TINY_NAMES  # noqa: F401  (torch-free, for `lmlab models`)

_WORDS = ("the a of to and in is was for on with as at by from that it his her their when then after "
          "Mary John Anna Tom Paris France Berlin Germany Rome Italy Madrid Spain London capital city "
          "country store drink gave went year war lasted def param return value name list string "
          "question answer what which who reason step final boxed plus minus equals").split()


def _corpus() -> list[str]:
    """A small deterministic corpus: every word, digits, code-ish and question-ish lines."""
    lines = [" ".join(_WORDS[i:i + 8]) for i in range(0, len(_WORDS), 3)]
    lines += [f"{a} + {b} = {a + b}" for a, b in itertools.product(range(0, 100, 7), range(0, 100, 11))]
    lines += ["The war lasted from the year 1732 to the year 1745.",
              "When Mary and John went to the store, John gave a drink to Mary.",
              "def f(name, value):\n    \"\"\"Return the value.\n\n    :param name: the name\n    \"\"\"",
              "Q: What is the capital of France? A: Paris", "Please reason step by step, \\boxed{42} / he"]
    return lines * 3


@lru_cache(maxsize=None)
def _byte_bpe() -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


@lru_cache(maxsize=None)
def _wordpiece() -> str:
    """The vocabulary is built here, not by `tokenizers`' WordPieceTrainer, whose vocabulary differs from one
    process to the next (its ties are broken in hash-map order), which made tiny-bert's numbers do the same:
    the specials, every character and its ## continuation, then the corpus's words, most frequent first."""
    pre = pre_tokenizers.BertPreTokenizer()
    counts = Counter(word for line in _corpus() for word, _ in pre.pre_tokenize_str(line))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted({c for word in counts for c in word})
    vocab = specials + chars + ["##" + c for c in chars]
    words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
    vocab += words[:400 - len(vocab)]
    tok = Tokenizer(models.WordPiece(vocab={t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok.to_str()


def tiny_tokenizer(kind: str = "bpe") -> PreTrainedTokenizerFast:
    """A fresh tokenizer object (callers may change padding side without affecting others)."""
    if kind == "wordpiece":
        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_wordpiece()), unk_token="[UNK]",
                                       pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_byte_bpe()), bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", pad_token="<pad>")


def tiny_config(name: str, vocab_size: int):
    if name == "tiny-llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           bos_token_id=0, eos_token_id=0, pad_token_id=1, tie_word_embeddings=False)
    if name == "tiny-gpt2":
        return GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=3, n_head=4, n_positions=256,
                          bos_token_id=0, eos_token_id=0, pad_token_id=1)
    if name == "tiny-bert":
        return BertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=256, pad_token_id=0)
    raise KeyError(name)


def build_tiny(name: str, seed: int = 0, head: str | None = None, num_labels: int | None = None):
    """(model, tokenizer) for one of `TINY_NAMES`, weights drawn from `seed`; head 'classifier' or 'base'."""
    tokenizer = tiny_tokenizer("wordpiece" if name == "tiny-bert" else "bpe")
    config = tiny_config(name, vocab_size=len(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if head == "classifier":
            config.num_labels = num_labels or 2
            model = AutoModelForSequenceClassification.from_config(config)
        elif head == "base":
            model = AutoModel.from_config(config)
        else:
            model = {"tiny-llama": LlamaForCausalLM, "tiny-gpt2": GPT2LMHeadModel, "tiny-bert": BertModel}[name](config)
    return model, tokenizer
