"""Run `easyvideor1 train CONFIG` (under torchrun) while recording every torch.distributed
collective: the function, the devices of its tensors and the file that called it. Each rank
writes `<out_dir>/collectives-rank<r>.json`. A test helper, run as a script."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
         "broadcast", "all_gather_object", "broadcast_object_list", "all_to_all_single", "gather", "scatter",
         "reduce", "barrier")
RECORDS: list[dict] = []


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if torch.is_tensor(v):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += [t for t in v if torch.is_tensor(t)]
    return out


def _recording(name, fn):
    def call(*args, **kwargs):
        caller = sys._getframe(1).f_code.co_filename
        devices = sorted({str(t.device) for t in _tensors(list(args) + list(kwargs.values()))})
        RECORDS.append({"fn": name, "devices": devices, "caller": caller})
        return fn(*args, **kwargs)
    return call


for name in NAMES:
    wrapped = _recording(name, getattr(c10d, name))
    setattr(c10d, name, wrapped)
    setattr(dist, name, wrapped)

if __name__ == "__main__":
    from easyvideor1 import distributed
    from easyvideor1.cli import main
    from easyvideor1.config import load_config

    code = main(["train", *sys.argv[1:]])
    out = load_config(sys.argv[1], sys.argv[2:]).logging.out_dir
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(out, f"collectives-rank{rank}.json"), "w") as f:
        json.dump({"group_device": str(distributed.collective_device()), "records": RECORDS}, f)
    sys.exit(code)
