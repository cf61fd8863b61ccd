"""How the compressed-tensors checkpoints here were made: llm-compressor's own GPTQ (or AWQ) in an environment of its
own, as a user makes one before passing it to lmlab as a model folder. lmlab cannot hold llm-compressor beside it
(llm-compressor 0.14.0.1 requires transformers <= 5.17 and compressed-tensors 0.19; lmlab 5.24 and 0.20), which is
what the test that reads these folders checks: a checkpoint written by one version pair is read by the other.

    python3 -m venv /tmp/lc && /tmp/lc/bin/pip install torch==2.13.0 llmcompressor==0.14.0.1
    # the original, from lmlab's environment:
    python -c "from lmlab.models.tiny import build_tiny; m, t = build_tiny('tiny-llama', 0); \
               m.save_pretrained('/tmp/tiny-llama'); t.save_pretrained('/tmp/tiny-llama')"
    /tmp/lc/bin/python make_with_llm_compressor.py /tmp/tiny-llama gptq-w4g32-tiny-llama gptq 4 32 16 64 \
        '[[5, 9, 13, 20, 33, 40, 51, 60, 70, 80, 90, 100]]'

Arguments: SRC OUT METHOD (gptq: symmetric; awq: asymmetric) BITS GROUP SAMPLES TOKENS [REFERENCE_TOKENS]. The
calibration text is the licence texts of Debian's /usr/share/common-licenses (the GPL family left out), cut into
SAMPLES rows of TOKENS tokens. With REFERENCE_TOKENS, the quantized model's logits on them, as llm-compressor holds
it in memory after its run, are saved beside the checkpoint (reference-logits.safetensors).
"""
import glob
import json
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmcompressor import oneshot

src, out, method, bits, group, nsamples, seqlen = sys.argv[1:8]
bits, group, nsamples, seqlen = int(bits), int(group), int(nsamples), int(seqlen)
torch.manual_seed(0)
tok = AutoTokenizer.from_pretrained(src)
model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
text = "\n\n".join(open(f, errors="ignore").read() for f in sorted(glob.glob("/usr/share/common-licenses/*"))
                   if not f.endswith(("GPL", "LGPL", "GFDL")))
ids = tok(text)["input_ids"]
rows = [ids[i:i + seqlen] for i in range(0, len(ids) - seqlen, seqlen)][:nsamples]
print(f"{len(rows)} calibration rows of {seqlen} tokens from {len(ids)}")
ds = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * seqlen for _ in rows]})
weights = {"num_bits": bits, "type": "int", "symmetric": method == "gptq", "strategy": "group", "group_size": group}
scheme = {"targets": ["Linear"], "weights": weights}
if method == "gptq":
    from llmcompressor.modifiers.quantization import GPTQModifier
    recipe = GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])
else:
    from llmcompressor.modifiers.awq import AWQModifier
    recipe = AWQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])
t0 = time.time()
oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=seqlen, num_calibration_samples=len(rows))
print(f"oneshot {time.time() - t0:.1f} s")
model.save_pretrained(out, save_compressed=True)
tok.save_pretrained(out)
if len(sys.argv) > 8:
    from safetensors.torch import save_file
    tokens = torch.tensor(json.loads(sys.argv[8]))
    with torch.no_grad():
        logits = model(tokens).logits
    save_file({"tokens": tokens, "logits": logits.contiguous()}, f"{out}/reference-logits.safetensors")
print("saved", out)
