"""Nested states (optimizer, LR schedule, RNGs, trainer) as JSON + safetensors, never a pickle.

`write_state(folder, "optimizer", tree)` writes `optimizer.json` (the structure) and
`optimizer.safetensors` (every tensor in the tree); `read_state` builds the tree back. A file
from someone else can hold only data: the decoder knows a closed set of tags and nothing in
either format can name code to run (a pickle, e.g. torch's `state.pt`, can).

The JSON structure: plain JSON for None/bool/int/float/str/list and for dicts whose keys are
all strings without a leading `__`; otherwise a one-key object naming what it holds:
    {"__tensor__": "3"}                   tensor number 3 of the .safetensors file
    {"__tuple__": [...]}                  a tuple (Python's RNG state, Adam's betas)
    {"__items__": [[key, value], ...]}    a dict with non-string keys (int parameter ids)
    {"__ndarray__": [...], "dtype": "uint32"}  a numpy array (numpy's RNG state), inline
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from easyvideor1.errors import UserError

_TAGS = ("__tensor__", "__tuple__", "__items__", "__ndarray__")


class StateFileError(UserError, ValueError):
    """A state file that is not what easyvideor1 writes (damaged, tampered with or a pickle)."""


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach().cpu().clone().contiguous()  # tied or viewed tensors share memory
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}.{k}")]
                              for k, v in obj.items()]}
    raise TypeError(f"state {where}: cannot store a {type(obj).__name__} without pickle")


def _decode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [_decode(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        raise StateFileError(f"{where}: unexpected JSON value {obj!r}")
    tag = next((t for t in _TAGS if t in obj), None)
    if tag is None:
        return {k: _decode(v, tensors, where) for k, v in obj.items()}
    if tag == "__tensor__":
        if obj[tag] not in tensors:
            raise StateFileError(f"{where}: tensor {obj[tag]!r} is missing from the .safetensors file")
        return tensors[obj[tag]]
    if tag == "__tuple__":
        return tuple(_decode(v, tensors, where) for v in obj[tag])
    if tag == "__items__":
        return {_decode(k, tensors, where): _decode(v, tensors, where) for k, v in obj[tag]}
    return np.asarray(obj[tag], dtype=np.dtype(obj["dtype"]))


def write_state(folder: str | os.PathLike, name: str, tree: Any) -> None:
    """Write `tree` as `<name>.json` + `<name>.safetensors` in `folder`."""
    folder = Path(folder)
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(tree, tensors, name)
    save_file(tensors, folder / f"{name}.safetensors")
    (folder / f"{name}.json").write_text(json.dumps({"format": "easyvideor1-state-1", "tree": structure}))


def read_state(folder: str | os.PathLike, name: str) -> Any:
    """The tree `write_state(folder, name, ...)` wrote; `StateFileError` naming the file if the
    files are not such a pair (a pickle, truncated, edited)."""
    folder = Path(folder)
    meta, weights = folder / f"{name}.json", folder / f"{name}.safetensors"
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateFileError(f"{meta} is not a JSON state file ({e}); it was damaged or replaced. Delete "
                             "this checkpoint folder (an older one is used) or resume with checkpoint.resume=never") from e
    if not isinstance(doc, dict) or doc.get("format") != "easyvideor1-state-1":
        raise StateFileError(f"{meta} is not an easyvideor1 state file (no format tag); delete this checkpoint "
                             "folder or resume with checkpoint.resume=never")
    try:
        tensors = load_file(weights)
    except (SafetensorError, OSError, ValueError) as e:
        raise StateFileError(f"{weights} is not a valid safetensors file ({e}); it was damaged or replaced. "
                             "Delete this checkpoint folder or resume with checkpoint.resume=never") from e
    try:
        return _decode(doc["tree"], tensors, str(meta))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, StateFileError):
            raise
        raise StateFileError(f"{meta}: malformed state structure ({e}); delete this checkpoint folder or "
                             "resume with checkpoint.resume=never") from e
