"""Write an HF weights folder one tensor at a time: safetensors files of bounded size.

The writer holds at most one file's worth of tensors (`max_bytes`, or one tensor larger than
that) before writing it, so exporting a model never needs the whole model in memory. The
layout is `save_pretrained`'s: `model.safetensors` when one file is enough, else
`model-0000i-of-0000N.safetensors` and `model.safetensors.index.json` (its weight map), which
`from_pretrained` and vLLM read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from easyvideor1.models.meta_init import INDEX, SINGLE  # the file names `save_pretrained` writes

SHARD_BYTES = 512 << 20  # per file: what rank 0 holds at most while exporting


class ShardWriter:
    """`add` tensors in order, then `close`; writes into `out_dir` (created)."""

    def __init__(self, out_dir: str | Path, max_bytes: int = SHARD_BYTES):
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[list[str]] = []  # names per written file, in order
        self.total_bytes = 0
        self.total_numel = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size
        self.total_numel += tensor.numel()

    def _part(self, i: int) -> Path:
        return self.out / f"model-part-{i:05d}.safetensors.tmp"

    def _flush(self) -> None:
        save_file(self.pending, str(self._part(len(self.files))), metadata={"format": "pt"})
        self.files.append(list(self.pending))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[Path]:
        """Write the last file, name the files as `save_pretrained` does, and the index; returns them."""
        if self.pending or not self.files:
            self._flush()
        n = len(self.files)
        names = [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        for old in [self.out / INDEX, self.out / SINGLE, *self.out.glob("model-?????-of-?????.safetensors")]:
            if old.name not in names and old.exists():  # a previous export's layout
                old.unlink()
        for i, name in enumerate(names):
            os.replace(self._part(i), self.out / name)
        if n > 1:
            index = {"metadata": {"total_parameters": self.total_numel, "total_size": self.total_bytes},
                     "weight_map": {t: names[i] for i, tensors in enumerate(self.files) for t in tensors}}
            (self.out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        return [self.out / name for name in names]
