import pytest
import torch

from lmlab.interventions import Knockout, intervene
from lmlab.trace import knockout_trace


def test_batched_trace_equals_one_knockout_per_layer_cutoff(device):
    lm = device.load("tiny-gpt2")
    prompt = "When Mary and John went to the store"
    table = knockout_trace(lm, prompt, " the", "Mary")
    enc = lm.encode(prompt)
    keys = torch.zeros_like(enc["input_ids"], dtype=torch.bool)
    keys[:, 1] = True  # " Mary"
    tid = lm.tokenizer(" the", add_special_tokens=False)["input_ids"][0]
    for k in range(lm.layout.n_layers):
        with torch.no_grad(), intervene(lm, Knockout(keys, layers=range(k + 1))):
            p = torch.softmax(lm.model(**enc).logits[0, -1], -1)[tid].item()
        # one row of a batch vs its own pass: float32 agrees to 1e-6, bf16 to its own step on a probability
        assert table.loc[k, "p_knockout"] == pytest.approx(p, abs=1e-6 if device.dtype == torch.float32
                                                            else device.tol(p)["atol"] + device.tol()["rtol"] * p)


@pytest.mark.embedded
def test_knocking_out_france_removes_paris(embedded_smollm):
    table = knockout_trace(embedded_smollm, "The capital of France is", " Paris", "France")
    assert table["p_clean"].iloc[0] > 0.5
    assert abs(table["delta_pp"].iloc[0]) < 5  # layer 0 alone barely matters
    assert table["p_knockout"].iloc[-1] < 0.05  # blocked in every layer: the answer is gone
