"""Devices and dtypes: every tensor a study makes is created on the model's device or staged on the host on
purpose (the stray-tensor check), a device the machine lacks is one sentence, and training in bf16 keeps
float32 master weights under autocast."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.studies import get_study, run_study


@pytest.fixture
def stray_tensors_go_to_meta():
    """Tensors created without a device land on `meta`, where the model is not: any of them that reaches the
    model, or is read back, fails. Host staging must say device="cpu"; everything else the model's device."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


SMALL = {
    "filler": dict(model="tiny-llama", n_test_per_level=2, n_dev_per_level=1, sweep_problems=2, profile_problems=2,
                   max_new_tokens=4, sweep_lengths=[5], arm_c=[0.13], arm_p1=[90.0]),
    "knockout": dict(model="tiny-llama", per_dataset=6, datasets=["geo-capital"], sweep_every=2),
    "quantize": dict(model="tiny-bert", tasks=["fact-cola"], n_train=32, n_eval=16, batch_size=16, teacher_epochs=1,
                     bits=[2]),
    "latent": dict(model="scratch", rates=[4], n_train=300, n_test=8, steps=3, vq_steps=3, seeds=2,
                   d_model=32, n_layers=2, batch_size=16),
}


@pytest.mark.parametrize("study", list(SMALL))
def test_a_study_makes_no_tensor_off_the_models_device(study, tmp_path, stray_tensors_go_to_meta):
    spec = get_study(study)
    result = run_study(spec, spec.config(**SMALL[study]), tmp_path)
    assert result.verdict.status in ("reproduced", "not reproduced", "inconclusive")


def test_the_toy_trains_and_evaluates_with_no_stray_tensor(tmp_path, stray_tensors_go_to_meta):
    from lmlab.interventions import SparseAttention
    from lmlab.studies.sparse_circuits.toy import model as toy
    from lmlab.train import TrainConfig, train

    model = toy.build_toy(seed=0, d_model=16, n_layers=1, n_heads=2).model
    data = toy.addition_data(n_test=50, seed=0, repeats=1)
    train(model, data.train[:64], toy.collate, toy.answer_loss, TrainConfig(steps=2, batch_size=32, progress=False),
          tmp_path)
    got = toy.evaluate(model, data.test[:4])
    assert 0 <= got["exact_match"] <= 1
    usage = toy.edge_usage(model, data.test[:2], [SparseAttention(sample=False)])
    assert usage.shape[0] == 1


def test_a_device_the_machine_lacks_is_one_sentence_before_any_work(tmp_path, monkeypatch):
    from lmlab.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LmlabError, match=r"^--device cuda:1: this machine has no CUDA device"):
        run_study(get_study("knockout"), get_study("knockout").config(model="tiny-llama", device="cuda:1"), tmp_path)
    assert not any(tmp_path.iterdir())  # no run folder
    with pytest.raises(SystemExit) as exc:
        main(["filler", "--model", "tiny-llama", "--device", "cuda", "--out", str(tmp_path)])
    assert exc.value.code == 2 and not any(tmp_path.iterdir())


def test_auto_device_and_dtype_resolve_for_this_machine():
    from lmlab.studies.runtime import resolve_device

    config = get_study("knockout").config(model="tiny-llama")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available() and torch.backends.mps.is_available():
        expected = "mps"
    assert resolve_device("auto") == expected == config.torch_device()
    assert config.train_settings() == {"mixed_precision": "bf16" if expected == "cuda" else "no",
                                       "cpu": expected == "cpu", "log_with": []}
    assert config.model_copy(update={"dtype": "bfloat16"}).train_settings()["mixed_precision"] == "bf16"
    assert config.model_copy(update={"dtype": "float32"}).train_settings()["mixed_precision"] == "no"


def test_bf16_inference_weights_but_float32_master_weights_for_training(tmp_path):
    from lmlab.train import TrainConfig, train

    config = get_study("quantize").config(model="tiny-llama", dtype="bfloat16", device="cpu")
    assert next(config.load().model.parameters()).dtype == torch.bfloat16
    lm = config.load(train=True)
    assert next(lm.model.parameters()).dtype == torch.float32
    seen = []  # a linear layer's output dtype inside the forward pass: bf16 under autocast
    linear = next(m for m in lm.model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))

    def loss_fn(model, batch):
        return model(input_ids=batch, labels=batch).loss

    data = [torch.randint(0, 100, (8,), device="cpu") for _ in range(8)]
    result = train(lm.model, data, torch.stack, loss_fn,
                   TrainConfig(steps=2, batch_size=4, progress=False, **config.train_settings()), tmp_path)
    assert torch.bfloat16 in seen and all(p.dtype == torch.float32 for p in lm.model.parameters())
    assert all(map(lambda x: x == x, result.losses))


@pytest.mark.embedded
def test_the_decoder_studies_make_no_tensor_off_the_models_device(tiny_smol, tmp_path):
    """S2's decoder option (KD batches, perplexity, circuit accuracy) and S4 end to end (sampling, sparse
    post-training, circuits, held-out sparsity, the toy), with stray tensors sent to meta."""
    s2, s4 = get_study("quantize"), get_study("sparse-circuits")
    c2 = s2.config(model="tiny-smol", tasks=["ioi"], bits=[2], budgets=["A"], n_text=8, n_eval_text=4, text_tokens=12,
                   n_prompts=4, batch_size=4)
    c4 = s4.config(model="tiny-smol", n_prompts=2, sparse_steps=2, sparse_batch=2, n_text=6, n_docstrings=2,
                   text_tokens=6, n_eval_text=2, eval_tokens=8, toy_steps=3, toy_sparse_steps=2, toy_width=32,
                   verify_heads=4, batch_size=4, fine_grid=False, seeds=2, rank_draws=5, toy_rank_draws=5)
    torch.set_default_device("meta")
    try:
        for spec, config in ((s2, c2), (s4, c4)):
            result = run_study(spec, config, tmp_path / spec.name, lm=tiny_smol)
            assert result.verdict.status in ("reproduced", "not reproduced", "inconclusive")
    finally:
        torch.set_default_device(None)


def test_a_model_trained_under_bf16_autocast_is_scored_under_it(tmp_path):
    """The quantize study scores its students in the precision they trained in: under bf16 the scored matmul runs
    in bf16 (its output is bf16), under "no" in the weights' float32; both predictions come back as float32."""
    import torch

    from lmlab.train.precision import scoring_precision

    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with scoring_precision("cpu", "bf16"):
        assert layer(x).dtype == torch.bfloat16
    with scoring_precision(torch.device("cpu"), "no"):
        assert layer(x).dtype == torch.float32
    from lmlab.studies.quantize.measure import predict_shared

    class Head(torch.nn.Module):  # a classifier's shape: logits of 3 labels for each row
        def __init__(self):
            super().__init__()
            self.emb, self.out = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3)
            self.seen = []

        def forward(self, input_ids, attention_mask=None):
            logits = self.out(self.emb(input_ids).mean(1))
            self.seen.append(logits.dtype)
            return type("Out", (), {"logits": logits})()

    class Ex:
        def __init__(self, i):
            self.text_a, self.text_b, self.i = "x" * i, None, i

    head = Head()
    collate = lambda exs: {"input_ids": torch.tensor([[e.i % 10, 1] for e in exs]), "labels": torch.zeros(len(exs))}
    bf16 = predict_shared(head, collate, [Ex(i) for i in range(5)], "bf16")
    full = predict_shared(head, collate, [Ex(i) for i in range(5)])
    assert head.seen == [torch.bfloat16, torch.float32] and bf16.dtype == full.dtype == np.float32
