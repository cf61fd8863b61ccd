"""The quantize study's decoder option: the XTC recipe on a causal LM (`lmlab quantize --model smollm2-135m`).

What 2- and 1-bit weights do to an LLM, with the same quantizers, the same one-stage KD (logits KL at
every position + attention-score MSE + hidden-state MSE, weights 1, no label loss) and the same
budgets as the encoder study. Differences, all forced by having no hub:
- KD data: text the full-precision teacher samples itself (data.generated.selftext, temperature 1,
  varied openers), cropped to one common length so no position is padding; a held-out slice of the
  same sampling gives the perplexity.
- Tasks: the sparse-circuits study's generated IOI / Greater-Than / Docstring / IOI-Long prompts, scored as
  accuracy (answer above distractor, or more probability above than below for Greater-Than). The rows have the
  encoder study's shape (kind = score / pred), so the figure, the intervals and the verdict are the same code;
  perplexity is an extra row kind ("lm") drawn as its own panel.
- The undistilled reference cell and the placebo (`--placebo`) are the encoder study's (recipe.py's docstring).
- Sizes: an LLM step costs ~100x a MiniLM step on CPU, so the quick profile runs Budget-A only with
  one short epoch; its verdict is about that budget (the Budget-C checks are then absent, not passed).

The package: data.py (the KD text the teacher samples, the circuit tasks, the sizes), run.py (the teacher and each
student distilled, packed and scored: the measurements), analysis.py (what the verdict adds for a decoder:
perplexity). recipe.py hands a causal model to `run.run_decoder`.
"""
