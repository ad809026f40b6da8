"""Checks of command-line arguments, made before anything heavy loads (no torch, no model).

Each check raises `UserError` with one line naming the argument, its value, what is wrong and
what to do; `cli.main` prefixes the command. The commands call these first, so a wrong path or
number answers in a fraction of a second, not after a model or an engine has started.

A model argument is a local folder, checked as one: no value ever reaches the hub's repo-id
check (a missing `owner/name` gets the download command in its message).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from easyvideor1.errors import UserError
from easyvideor1.models.families import MODEL_FAMILIES

DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
CONFIG_SUFFIXES = (".yaml", ".yml")
DTYPE_NAMES = ("bfloat16", "float16", "float32")  # models.loading.DTYPES, without importing torch
# A processor folder needs a tokenizer and an image/video processor config (either name is enough).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as the hub spells a repository
TINY_HINT = "easyvideor1 tiny-model --family qwen2_5_vl --out DIR"


def input_file(flag: str, value: str, what: str = "a sample file (.json, .jsonl or .parquet)",
               suffixes: tuple[str, ...] = DATA_SUFFIXES) -> Path:
    """`value` as an existing file with one of `suffixes` (empty: any); a YAML config given where
    samples go, or a sample file where a config goes, is named as such."""
    path = Path(value).expanduser()
    if path.is_dir():
        raise UserError(f"{flag} {value}: is a folder; give {what}")
    if not path.exists():
        raise UserError(f"{flag} {value}: no such file; give {what}")
    suffix = path.suffix.lower()
    if suffixes and suffix not in suffixes:
        if suffix in CONFIG_SUFFIXES:
            raise UserError(f"{flag} {value}: is a YAML config, not {what} (a config goes to "
                            "`easyvideor1 train CONFIG`)")
        if suffix in DATA_SUFFIXES and suffixes == CONFIG_SUFFIXES:
            raise UserError(f"{flag} {value}: is a sample file, not a YAML config; give samples as "
                            f"data.train_files={value}")
        raise UserError(f"{flag} {value}: unsupported file type {suffix or '(none)'!r}; give {what}")
    return path


def input_folder(flag: str, value: str | None, what: str = "an existing folder") -> Path | None:
    """`value` as an existing folder (None passes)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.exists():
        raise UserError(f"{flag} {value}: no such folder; give {what}")
    if not path.is_dir():
        raise UserError(f"{flag} {value}: is a file, not a folder; give {what}")
    return path


def template(flag: str, value: str | None) -> Path | None:
    """`value` as a prompt template: a folder of `*.jinja` files (named by problem type), or one
    `.jinja` file used for every sample (None passes)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    what = "a folder of prompt templates (*.jinja), or one .jinja file for every sample"
    if not path.exists():
        raise UserError(f"{flag} {value}: no such file or folder; give {what}")
    if path.is_file() and path.suffix != ".jinja":
        raise UserError(f"{flag} {value}: not a .jinja file; give {what}")
    return path


def output_folder(flag: str, value: str) -> Path:
    """A folder the command may create or write into: not a file, under a writable folder."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {value}: is a file; give a folder (existing or new) for the outputs")
    _writable(flag, value, path if path.is_dir() else _nearest_existing(path))
    return path


def output_file(flag: str, value: str) -> Path:
    """A file the command may create or overwrite: not a folder, in a writable folder."""
    path = Path(value).expanduser()
    if path.is_dir():
        raise UserError(f"{flag} {value}: is a folder; give a file path for the output")
    _writable(flag, value, _nearest_existing(path.parent))
    return path


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def _writable(flag: str, value: str, folder: Path) -> None:
    """Creating (and removing) an empty folder in `folder` is the one test of writability that
    holds for root, read-only mounts and pseudo file systems alike (/proc)."""
    if not folder.is_dir():
        raise UserError(f"{flag} {value}: {folder} is a file, so nothing can be created under it; "
                        "choose another output path")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".easyvideor1-probe-", dir=folder))
    except OSError as e:
        raise UserError(f"{flag} {value}: cannot write under {folder} ({e.strerror or e}); "
                        "choose a writable output path") from None


def looks_local(value: str) -> bool:
    """Whether `value` names a local path (it exists, starts with `.`, `/` or `~`, or has a separator)."""
    return value.startswith((".", "/", "~")) or os.sep in value or "/" in value or Path(value).exists()


def model_folder(flag: str, value: str) -> str:
    """`value` as a local HF-format model folder of a supported family (config.json with a known
    model_type, a tokenizer, a processor config, weights); returns the family's name."""
    path = Path(value).expanduser()
    if not path.exists():
        hint = (f" (a hub id is not fetched: `huggingface-cli download {value} --local-dir DIR` first)"
                if HUB_ID.fullmatch(value) else "")
        raise UserError(f"{flag} {value}: no such folder; give a local HF-format model folder{hint}, or "
                        f"build a tiny one with `{TINY_HINT}`")
    if not path.is_dir():
        raise UserError(f"{flag} {value}: is a file; give the model's folder (the one holding config.json)")
    config = path / "config.json"
    if not config.is_file():
        _training_output(flag, value, path)
        raise UserError(f"{flag} {value}: no config.json in this folder, so it is not an HF-format model; "
                        f"give the model's folder, or build a tiny one with `{TINY_HINT}`")
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise UserError(f"{flag} {value}: config.json is not a JSON object ({e}); fetch the model again") from None
    families = {f.model_type: f.name for f in MODEL_FAMILIES.values()}
    if model_type not in families:
        raise UserError(f"{flag} {value}: model_type {model_type!r} in config.json is not a supported family; "
                        f"supported: {', '.join(families)}")
    for kind, names in (("tokenizer", TOKENIZER_FILES), ("processor", PROCESSOR_FILES), ("weights", WEIGHT_FILES)):
        if not any((path / name).is_file() for name in names):
            raise UserError(f"{flag} {value}: no {kind} file in this folder (looked for {', '.join(names)}); "
                            "copy the model's full folder (config, tokenizer, processor and weights)")
    return families[model_type]


def _training_output(flag: str, value: str, path: Path) -> None:
    """A checkpoint, run or demo folder given where an HF model goes: the folder to give
    instead, or the command that exports one."""
    for sub in ("hf_model", "train/hf_model"):  # a run's (train) or a demo's export
        if (path / sub / "config.json").is_file():
            raise UserError(f"{flag} {value}: is a training run's folder, not a model; its trained model is "
                            f"{path / sub}: give {flag} {path / sub}")
    checkpoint = (path / "state.json").is_file()
    if checkpoint or (path / "checkpoints").is_dir() or (path / "train" / "checkpoints").is_dir():
        kind = "a training checkpoint" if checkpoint else "a training run's folder"
        out = (path.parent.parent if checkpoint and path.parent.name == "checkpoints" else path) / "hf_model"
        raise UserError(f"{flag} {value}: is {kind}, not an HF-format model; export it first, "
                        f"`easyvideor1 export {value} --out {out}`, then give {flag} {out}")


def at_least(low: float, **values: float | None) -> None:
    """Each `flag_name=value` (underscores for dashes) is None or >= `low`."""
    for name, value in values.items():
        if value is not None and value < low:
            raise UserError(f"{_flag(name)} {value}: out of range; give a number >= {low}")


def above(low: float, **values: float | None) -> None:
    """Each `flag_name=value` is None or > `low`."""
    for name, value in values.items():
        if value is not None and not value > low:
            raise UserError(f"{_flag(name)} {value}: out of range; give a number > {low}")


def within(low: float, high: float, **values: float | None) -> None:
    """Each `flag_name=value` is None or in [low, high]."""
    for name, value in values.items():
        if value is not None and not low <= value <= high:
            raise UserError(f"{_flag(name)} {value}: out of range; give a number in [{low}, {high}]")


def known(flag: str, value: str, names: Iterable[str]) -> str:
    """`value` is one of `names` (listed in the error)."""
    names = list(names)
    if value not in names:
        raise UserError(f"{flag} {value!r}: unknown; choose from {', '.join(names)}")
    return value


def run_flags(args) -> None:
    """The flags `eval`, `pass-rate` and `trajectories` share: frame cache, templates, dtype and
    the loading / batching numbers."""
    if args.cache_mode == "cache_only" and args.cache_dir is None:
        raise UserError("--cache-mode cache_only needs --cache-dir DIR (the folder `easyvideor1 cache` built)")
    if args.cache_dir is not None and (args.cache_mode == "cache_only" or Path(args.cache_dir).exists()):
        input_folder("--cache-dir", args.cache_dir, "the folder `easyvideor1 cache` built")
    template("--template-dir", args.template_dir)
    if args.dtype is not None:
        known("--dtype", args.dtype, DTYPE_NAMES)
    at_least(1, load_workers=args.load_workers, prefetch=args.prefetch, max_batch=args.max_batch,
             max_concurrency=args.max_concurrency)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
