"""The optional extras (pyproject.toml) and the sentence that names each when its package is missing. At the bottom
of the house with errors.py: the command line, the study configs and the modules that need an extra all read it
here, so none imports another to learn the wording."""

EXPORT = "the compressed-tensors export needs the compressed-tensors package: pip install 'lmlab[export]'"
LMEVAL = "the lm-eval model type needs lm-evaluation-harness: pip install 'lmlab[lmeval]'"
HQQ = ("--make hqq needs Half-Quadratic Quantization's package: DISABLE_CUDA=1 pip install 'lmlab[hqq]' (without a "
       "CUDA compiler; plain pip install 'lmlab[hqq]' with one)")
EXPORT_FORMATS = ("compressed-tensors",)  # what `lmlab export --format` and `--export` take
COMPRESSED = ("this model folder is a compressed-tensors checkpoint (llm-compressor's GPTQ, AWQ, ...); reading it needs "
              "the compressed-tensors package: pip install 'lmlab[export]'")
BITSANDBYTES = ("this model folder (or --make bnb) needs bitsandbytes (its CPU backend serves here): "
                "pip install 'lmlab[bnb]'")
TORCHAO = "--make torchao needs PyTorch's torchao package (its weight-only quantizers): pip install 'lmlab[torchao]'"
AUTOROUND = "--make awq needs Intel's AutoRound package (its AWQ): pip install 'lmlab[autoround]'"
