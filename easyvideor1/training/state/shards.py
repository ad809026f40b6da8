"""Per-rank tensor shards of a checkpoint: each rank writes the slices it holds; any rank reads
any box of any tensor, whatever the number of processes that wrote it.

A sharded tensor (an FSDP2 DTensor) is written by every rank as its local slice; a plain tensor
(a buffer, Adam's `step`, every tensor of an unsharded one-process run) by rank 0 alone.
Rank r's files for part `name` ("model", "optimizer"):

    name.rank00003.safetensors   the slices, keyed by the tensor's name
    name.rank00003.json          {"format": ..., "tensors": {key: {"shape": global shape,
                                  "offsets": where the slice starts in each dimension,
                                  "slice": the slice's shape}}}

The .safetensors file is written tensor by tensor from the tensors themselves (no serialised
copy of the whole shard in memory, unlike `safetensors.torch.save_file`). Reading (`Shards`)
takes every rank's JSON, finds the slices that overlap the box a rank owns in the current run
and reads just those rows with `safe_open(...).get_slice`: a rank never reads another rank's
part of a tensor, and resuming on a different number of processes reshards by global offsets.
Nothing here is a pickle: JSON and safetensors hold data only.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from easyvideor1 import distributed
from easyvideor1.training.state.files import StateFileError

FORMAT = "easyvideor1-shards-1"
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}
_HINT = "delete this checkpoint folder (an older one is used) or resume with checkpoint.resume=never"


def shard_files(folder: Path, name: str) -> list[Path]:
    """The JSON descriptions of part `name`'s shards in `folder`, one per rank that wrote."""
    return sorted(folder.glob(f"{name}.rank*.json"))


def local_slice(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(the part of `tensor` this rank holds, its offsets in the global tensor)."""
    if not isinstance(tensor, DTensor):
        return tensor, (0,) * tensor.dim()
    shape, offsets = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    local = tensor.to_local()
    assert tuple(local.shape) == tuple(shape), (local.shape, shape)  # FSDP2's uneven shards: unpadded views
    return local, tuple(offsets)


def _writes(tensor: torch.Tensor) -> bool:
    """Whether this rank writes `tensor`: its slice if it is sharded; a replicated one on rank 0 only."""
    sharded = isinstance(tensor, DTensor) and any(isinstance(p, Shard) for p in tensor.placements)
    return sharded or distributed.rank() == 0


def write_shard(folder: Path, name: str, tensors: dict[str, torch.Tensor]) -> Path:
    """Write this rank's slices of `tensors` as `name.rankNNNNN.{safetensors,json}`; returns the
    .safetensors file. Every rank calls it (a rank may write no tensor at all)."""
    pieces = {}
    for key, tensor in tensors.items():
        if _writes(tensor):
            local, offsets = local_slice(tensor.detach())
            if local.numel() or tensor.numel() == 0:  # an uneven split can leave a rank no rows
                pieces[key] = (local, offsets, tuple(tensor.shape))
    stem = f"{name}.rank{distributed.rank():05d}"
    header, start = {}, 0
    for key, (local, _, _) in pieces.items():
        size = local.numel() * local.element_size()
        header[key] = {"dtype": _DTYPES[local.dtype], "shape": list(local.shape), "data_offsets": [start, start + size]}
        start += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    path = folder / f"{stem}.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for local, _, _ in pieces.values():  # one tensor at a time: at most one extra copy (off the GPU)
            data = local.contiguous().cpu().reshape(-1)
            f.write(data.view(torch.uint8).numpy().data if data.numel() else b"")
    doc = {"format": FORMAT, "rank": distributed.rank(), "world": distributed.world_size(),
           "tensors": {k: {"shape": list(g), "offsets": list(o), "slice": list(t.shape)}
                       for k, (t, o, g) in pieces.items()}}
    (folder / f"{stem}.json").write_text(json.dumps(doc))
    return path


class Shards:
    """Every rank's shards of part `name` in a checkpoint `folder`, read by box."""

    def __init__(self, folder: str | os.PathLike, name: str):
        self.folder = Path(folder)
        self.pieces: dict[str, list[tuple[Path, tuple[int, ...], tuple[int, ...]]]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for meta in shard_files(self.folder, name):
            try:
                doc = json.loads(meta.read_text(encoding="utf-8"))
                assert doc["format"] == FORMAT
                for key, info in doc["tensors"].items():
                    self.shapes[key] = tuple(int(n) for n in info["shape"])
                    start, size = tuple(int(n) for n in info["offsets"]), tuple(int(n) for n in info["slice"])
                    assert len(start) == len(size) == len(self.shapes[key])
                    self.pieces.setdefault(key, []).append((meta.with_suffix(".safetensors"), start, size))
            except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
                raise StateFileError(f"{meta} is not an easyvideor1 shard description ({e!r}); {_HINT}") from e

    @staticmethod
    def _handle(path: Path) -> Any:
        """The file opened (memory-mapped) for one read: dropped after it, so the pages read do not
        stay mapped into this process while the next tensors are read."""
        try:
            return safe_open(str(path), framework="pt")
        except Exception as e:  # safetensors raises its own error types for damaged files
            raise StateFileError(f"{path} is not a valid safetensors file ({e}); {_HINT}") from e

    def read_box(self, key: str, dest: torch.Tensor, offsets: tuple[int, ...]) -> None:
        """Fill `dest` with the box of tensor `key` that starts at `offsets`, reading only the
        rows of each stored slice that fall inside it."""
        filled = 0
        for path, start, size in self.pieces.get(key, []):
            lo = [max(o, s) for o, s in zip(offsets, start)]
            hi = [min(o + d, s + n) for o, d, s, n in zip(offsets, dest.shape, start, size)]
            if any(a >= b for a, b in zip(lo, hi)):
                continue  # another rank's rows: that file is not even opened
            handle = self._handle(path)
            src = tuple(slice(a - s, b - s) for a, b, s in zip(lo, hi, start))
            dst = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offsets))
            try:
                dest[dst].copy_(handle.get_slice(key)[src] if src else handle.get_tensor(key))
            except Exception as e:  # a key or shape the description promised but the file lacks
                raise StateFileError(f"{path}: {key} does not match its description ({e}); {_HINT}") from e
            filled += int(torch.Size([b - a for a, b in zip(lo, hi)]).numel())
        if filled < dest.numel():
            raise StateFileError(f"checkpoint {self.folder} lacks part of {key} ({filled} of {dest.numel()} "
                                 f"values found in its shards); {_HINT}")

    def fill(self, key: str, target: torch.Tensor) -> None:
        """Copy the saved `key` into `target` in place: this rank's slice of it if it is a
        DTensor, the whole tensor otherwise."""
        if key not in self.shapes:
            raise StateFileError(f"checkpoint {self.folder} holds no {key}: resume with the model and settings "
                                 "it was written with, or checkpoint.resume=never")
        if self.shapes[key] != tuple(target.shape):
            raise StateFileError(f"checkpoint {self.folder} holds {key} of shape {list(self.shapes[key])}, this "
                                 f"run's is {list(target.shape)}: resume with the model it was written with, "
                                 "or checkpoint.resume=never")
        local, offsets = local_slice(target.detach())
        with torch.no_grad():
            self.read_box(key, local, offsets)

    def full(self, key: str) -> torch.Tensor:
        """The whole tensor `key` (export, one process)."""
        stored = self._handle(self.pieces[key][0][0]).get_slice(key).get_dtype()
        out = torch.empty(self.shapes[key], dtype=next(t for t, n in _DTYPES.items() if n == stored))
        self.read_box(key, out, (0,) * out.dim())
        return out
