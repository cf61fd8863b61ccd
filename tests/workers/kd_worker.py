"""One S2 student (the study's own pieces: the generated task, a fine-tuned-looking teacher, a 2-bit copy, the
teacher cache, KD with logits + attention scores + hidden states, the study's train config) on tiny-bert, a few
steps; run alone or under torchrun. Dropout is off (each process draws its own masks: the same distribution, not
the same masks). Writes the loss curve as JSON on rank 0."""

import copy
import sys

import torch


def main(out_dir: str) -> list[float]:
    torch.set_num_threads(1)
    from lmlab.data.generated.nlu import generate_task
    from lmlab.interventions.quant import quantize_model
    from lmlab.studies.quantize.config import Config
    from lmlab.studies.quantize.measure import collate_for, seed_unit, teacher_cache, train_config
    from lmlab.train import train
    from lmlab.train.kd import Indexed, indexed_collate, kd_loss

    config = Config(model="tiny-bert", device="cpu", tasks=["fact-qnli"], n_train=24, n_eval=8, epochs_a=1,
                    batch_size=4, student_lr=5e-4)
    task = generate_task("fact-qnli", config.size("n_train"), config.size("n_eval"), config.seed)
    teacher = config.load(train=True, head="classifier", num_labels=task.num_labels, seed=config.seed).model
    for module in teacher.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    collate = collate_for(config.load(train=True).tokenizer, task, config.max_length)
    seed_unit(config.seed, task.name, "2bit-A")
    student = copy.deepcopy(teacher)
    for p in student.parameters():
        p.requires_grad_(True)
    quantize_model(student, 2)
    cache = teacher_cache(config, task, teacher, collate)
    tc = train_config(config, 1, len(task.train), config.size("student_lr"), "student").model_copy(
        update={"progress": False})
    return train(student, Indexed(task.train), indexed_collate(collate),
                 lambda m, b: kd_loss(m, teacher, b, False, cache=cache)[0], tc, out_dir).losses


if __name__ == "__main__":
    from _report import report  # (the workers' folder is on the path of a script run from it)

    report(sys.argv[2], {"losses": main(sys.argv[1])})
