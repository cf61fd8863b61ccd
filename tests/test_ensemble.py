"""Replicates trained together (a stacked model) are the replicates trained alone, each from its seed."""

import pytest
import torch

from lmlab.models.batch import pad_sequences
from lmlab.models.scratch import ScratchSpec, build_scratch
from lmlab.train import TrainConfig, train
from lmlab.train.ensemble import member, per_replicate_ce, replicas, rows, stack, unstack

SEEDS = [11, 22, 33]


def _models(tie=True):
    return [build_scratch(ScratchSpec(vocab_size=40, d_model=32, n_layers=2, n_heads=4, tie_embeddings=tie, seed=s))
            for s in SEEDS]


def _data():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 40, (int(n),), generator=g).tolist() for n in torch.randint(5, 14, (24,), generator=g)]


def _collate(seqs):  # right-padded, the loss on real tokens only (as S0's chains)
    return pad_sequences(seqs, 0, side="right", label_from=[1] * len(seqs))


def _loss(model, batch):
    k = replicas(model)
    if k == 1:
        return model(**batch).loss
    ce, tokens = per_replicate_ce(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                  batch["labels"], k)
    return ce / tokens


@pytest.mark.parametrize("tie", [True, False])
def test_a_stacked_model_computes_each_replicate_as_the_model_alone(tie):
    models = _models(tie)
    stacked = stack(models)
    batch = _collate(_data()[:4])
    ids, mask = rows(stacked, batch["input_ids"]), rows(stacked, batch["attention_mask"])
    out = stacked(input_ids=ids, attention_mask=mask).logits.reshape(3, 4, *ids.shape[1:], -1)
    for r, m in enumerate(models):
        assert torch.allclose(out[r], m(**{k: v for k, v in batch.items() if k != "labels"}).logits, atol=1e-5)
        assert torch.equal(member(stacked, r, models[0])(input_ids=batch["input_ids"]).logits,
                           m(input_ids=batch["input_ids"]).logits)
    gen = stacked.generate(input_ids=rows(stacked, batch["input_ids"][:2, :4]), max_new_tokens=5, do_sample=False,
                           pad_token_id=0)
    for r, m in enumerate(models):
        assert torch.equal(gen[2 * r:2 * r + 2], m.generate(input_ids=batch["input_ids"][:2, :4], max_new_tokens=5,
                                                            do_sample=False, pad_token_id=0))


def test_replicates_trained_together_equal_each_trained_alone(tmp_path):
    """Same seeds, same data: the stacked training's per-replicate loss curves and final weights match three solo
    trainings (float tolerance), and a killed stacked training resumes to the same curve."""
    cfg = dict(steps=8, batch_size=6, lr=3e-3, weight_decay=0.1, warmup_steps=2, max_grad_norm=0.5, progress=False,
               checkpoint_every=3)
    alone = []
    for seed, model in zip(SEEDS, _models()):
        res = train(model, _data(), _collate, _loss, TrainConfig(seed=seed, **cfg), tmp_path / f"solo{seed}")
        alone.append((res.losses, model.state_dict()))
    stacked = stack(_models())
    res = train(stacked, _data(), _collate, _loss, TrainConfig(replicate_seeds=SEEDS, **cfg), tmp_path / "stacked")
    curves = torch.tensor(res.replicate_losses)  # (steps, replicates)
    for r, (losses, state) in enumerate(alone):
        assert curves[:, r].tolist() == pytest.approx(losses, abs=2e-5)
        for name, value in unstack(stacked)[r].items():
            assert torch.allclose(value, state[name], atol=2e-5), name
    assert res.losses == pytest.approx(curves.mean(1).tolist(), abs=1e-6)

    def stop(step, loss):
        if step == 4:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        train(stack(_models()), _data(), _collate, _loss, TrainConfig(replicate_seeds=SEEDS, **cfg), tmp_path / "cut",
              on_step=stop)
    again = train(stack(_models()), _data(), _collate, _loss, TrainConfig(replicate_seeds=SEEDS, **cfg),
                  tmp_path / "cut")
    assert again.resumed_from == 3
    assert torch.allclose(torch.tensor(again.replicate_losses), curves, atol=1e-6)


def test_a_config_whose_seeds_do_not_match_the_replicates_is_refused(tmp_path):
    from lmlab.errors import LmlabError

    with pytest.raises(LmlabError, match="3 replicate"):
        train(stack(_models()), _data(), _collate, _loss, TrainConfig(steps=1, batch_size=2, progress=False),
              tmp_path)
