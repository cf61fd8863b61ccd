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


def _keep(record) -> bool:
    """False for the two import notes `quiet_import_notes` drops (the kernels' only where no GPU is visible: on a GPU
    machine a kernel that does not load is news)."""
    text = str(record.msg)
    if "register_constant() on Enum subclasses is deprecated" in text:
        return False
    if text.startswith("Failed to load") and ".so" in record.getMessage():
        import torch  # (imported already: torchao is importing it)

        return torch.cuda.is_available()
    return True


def quiet_import_notes() -> None:
    """Drop two notes the torchao extra's import logs (transformers imports torchao wherever it is installed, so every
    run would print them): that its GPU kernels do not load, on a machine without a GPU, and torch's that torchao
    registers enums the old way. They speak of the installed packages, not of a run; only those records are
    dropped, every other warning of both loggers stays."""
    import logging

    for name in ("torchao", "torch.utils._pytree"):
        logger = logging.getLogger(name)
        if _keep not in logger.filters:
            logger.addFilter(_keep)
