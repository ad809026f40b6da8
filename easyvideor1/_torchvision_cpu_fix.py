"""Lets PyPI's CUDA torchvision import beside a CPU-only torch.

PyPI ships torchvision as a CUDA build; next to torch's CPU wheel its C++ extension fails to
load and `import torchvision` dies on `torchvision::nms does not exist` (ENVIRONMENT.md).
Every Qwen image/video processor in transformers needs torchvision's Python transforms only,
so we declare the two missing op schemas before torchvision is first imported.

Installed by scripts/setup.sh as a `.pth` line. To keep interpreter start-up cheap it only
registers a meta-path finder; torch is imported when (and if) torchvision is. It does nothing
where torch has CUDA (the real ops load there).
"""

import importlib.abc
import sys


def declare_missing_ops() -> None:
    import torch

    if torch.version.cuda is not None:
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name in ("nms", "qnms"):
        try:
            lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:
            pass  # already defined (real extension loaded, or hook ran twice)
    # Keep the fragment alive for the life of the process.
    sys.modules[__name__]._lib = lib


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            try:
                declare_missing_ops()
            except Exception:  # never break an interpreter over this
                pass
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path) and "torchvision" not in sys.modules:
    sys.meta_path.insert(0, _Finder())
