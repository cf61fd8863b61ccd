import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from lmlab.models import load_model  # noqa: E402

# Under pytest-xdist (`-n 2`, the Makefile's test command) each worker computes on one thread: the cores are
# shared out between the workers instead of between torch's threads, which keeps both busy through the suite's
# single-threaded stretches (imports, tokenizers, Python-level loops, file writes).
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

PROMPTS = ["When Mary and John went to the store, John gave a drink to",
           "The war lasted from the year 1732 to the year 17",
           "the capital of France is Paris"]


def pytest_configure(config):
    config.addinivalue_line("markers", "embedded: needs the embedded SmolLM2 model (slower)")
    config.addinivalue_line("markers", "faults: kills a study at many points and resumes it (tests/faults.py)")


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-gpt2"])
def decoder(request):
    """A tiny decoder of each family with interventions tested on two families."""
    return load_model(request.param)


@pytest.fixture(scope="session")
def tiny_llama():
    return load_model("tiny-llama")


def load_embedded(name: str):
    """An embedded model; a missing package fails loudly (CI must not skip)."""
    try:
        return load_model(name)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"embedded model unavailable: {exc}")


@pytest.fixture(scope="session")
def embedded_smollm():
    """SmolLM2-135M, loaded once per test session (cached safetensors after the first time)."""
    return load_embedded("smollm2-135m")


@pytest.fixture
def batch(decoder):
    return decoder.encode(PROMPTS)


@pytest.fixture
def tiny_smol_folder(embedded_smollm, tmp_path):
    """A tiny random Llama that speaks SmolLM2's tokenizer (the circuit tasks need its single-token names), saved
    as a local model folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(embedded_smollm.tokenizer), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    folder = tmp_path / "tiny-smol"
    LlamaForCausalLM(cfg).save_pretrained(folder)
    embedded_smollm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def tiny_smol(tiny_smol_folder):
    """That model loaded back through load_model like any local model."""
    return load_model(str(tiny_smol_folder))
