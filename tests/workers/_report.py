"""What every training worker does at its end: rank 0 (or the only process) writes its result as JSON with the
number of processes it ran in, then every process leaves the process group."""

import json


def report(path: str, result: dict) -> None:
    import torch.distributed as dist

    from lmlab import parallel

    if not dist.is_initialized() or dist.get_rank() == 0:
        result["processes"] = dist.get_world_size() if dist.is_initialized() else 1
        with open(path, "w") as fh:
            json.dump(result, fh)
    parallel.close()
