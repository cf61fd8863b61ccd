import os
from dataclasses import dataclass

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from lmlab.models import load_model  # noqa: E402

from helpers import tolerance  # noqa: E402
# The emulated GPU (tests/emulated_gpu.py) registers before any backward pass (torch's autograd engine sizes its
# per-device queues at its first backward), and only where there is no real GPU: beside CUDA a second accelerator
# backend becomes torch's accelerator, so CUDA's backward passes fail an assertion on their streams and factories
# follow the emulated device (seen on an H100, torch 2.11).
if not torch.cuda.is_available():
    import emulated_gpu  # noqa: E402,F401

# Under pytest-xdist (`-n 2`, the Makefile's test command) each worker computes on one thread: the cores are
# shared out between the workers instead of between torch's threads, which keeps both busy through the suite's
# single-threaded stretches (imports, tokenizers, Python-level loops, file writes).
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # and so does every process a test starts (a notebook's kernel, a command line, a loading process, a fork
    # server): a child computing on two threads beside the other worker's busy core spins for a core it does not
    # get, many times slower than on one. A test that sets its children's threads itself keeps its own.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

PROMPTS = ["When Mary and John went to the store, John gave a drink to",
           "The war lasted from the year 1732 to the year 17",
           "the capital of France is Paris"]


def pytest_configure(config):
    config.addinivalue_line("markers", "embedded: needs the embedded SmolLM2 model (slower)")
    config.addinivalue_line("markers", "architectures: one conformance row of lmlab.conformance a test")
    config.addinivalue_line("markers", "faults: kills a study at many points and resumes it (tests/faults.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A test that reaches the embedded SmolLM2 through a fixture (a folder with its tokenizer, the compare controls)
    is an embedded test, marked or not, so `-m "not embedded"` (a machine without the embedded models) leaves it
    out. Runs before pytest's own selection by marker."""
    for item in items:
        if "embedded_smollm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.embedded)


def test_devices() -> list[str]:
    """Where the model tests run: the CPU always, CUDA as well where torch sees one. LMLAB_TEST_DEVICES names others
    (comma-separated): `cpu-bf16` (the CPU with bf16 weights, a GPU's numbers) and `fakegpu` (tests/emulated_gpu.py:
    a device of its own backed by the CPU, with CUDA's device rules: what a GPU run would catch of devices)."""
    named = os.environ.get("LMLAB_TEST_DEVICES")
    if named:
        return [d.strip() for d in named.split(",") if d.strip()]
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@dataclass(frozen=True)
class Device:
    """A test's device and the dtype its models load in there: lmlab's defaults (float32 on the CPU, bf16 on a GPU
    or the emulated one), `cpu-bf16` bf16 on the CPU. Comparisons take their tolerance from the dtype
    (`tol`); a reference is computed on the device of what it checks."""

    name: str

    @property
    def torch_device(self) -> torch.device:
        if self.name == "fakegpu":
            from emulated_gpu import DEVICE

            return DEVICE
        return torch.device(self.name.removesuffix("-bf16"))

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32 if self.name == "cpu" else torch.bfloat16

    @property
    def type(self) -> str:
        return self.torch_device.type

    def load(self, spec: str, **kwargs):
        """`load_model` on this device, in its dtype (unless the test names one)."""
        kwargs.setdefault("dtype", self.dtype)
        return load_model(spec, device=self.torch_device, **kwargs)

    def tol(self, scale: float = 1.0, dtype: torch.dtype | None = None) -> dict:
        """assert_close's atol and rtol for a quantity of `scale` (its typical magnitude) computed in `dtype`."""
        return tolerance(dtype or self.dtype, scale)


@pytest.fixture(scope="session", params=test_devices())
def device(request) -> Device:
    return Device(request.param)


@pytest.fixture(autouse=True)
def _emulated_gpu_for_its_tests(request):
    """A test on the emulated GPU runs inside it (lmlab's `auto` device and accelerate's device are the emulated
    one)."""
    if "device" in request.fixturenames and request.getfixturevalue("device").name == "fakegpu":
        import emulated_gpu

        with emulated_gpu.emulated_gpu():
            yield
    else:
        yield


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-gpt2"])
def decoder(request, device):
    """A tiny decoder of each family with interventions tested on two families, on the test's device."""
    return device.load(request.param)


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-gpt2"])
def decoder32(request, device):
    """The tiny decoders in float32 on the test's device: for checks of a method's mathematics (first-order
    agreement, sums to 1e-5) that a bf16 forward pass cannot resolve."""
    return device.load(request.param, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_llama(device):
    return device.load("tiny-llama")


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
