"""The settings that change benchmark scores, stored beside the results and hashed.

A results folder holds `settings.json`: every score-changing setting (frame rate, frame and
pixel budgets, prompt template, sampling parameters, model path, engine, LLM judge) flattened
to dotted keys, plus two hashes of them:

- `hash` covers everything. A resume must match it: mixing rows generated under two settings
  in one results file would make the scores meaningless.
- `protocol_hash` covers everything except the model path and the template's path (its
  digest stays). Comparing two models is only
  meaningful under the same protocol, so `report --compare` requires equal protocol hashes.

A mismatch is refused with a message listing each differing setting and both values.
The frame budget is the vision package's `VisionConfig` (its `key_params`, the fields that
decide the pixels), so it is defined once for training, caching and evaluation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from easyvideor1.errors import UserError
from easyvideor1.vision.config import VisionConfig

ENGINES = ("vllm", "hf")
# Keys left out of the protocol hash: what legitimately differs between compared runs. The
# template's path is one: `prompt_digest` holds its files' names and contents (a model's copy
# of a template and the original are one protocol).
UNHASHED_KEYS = ("model_path", "prompt_template")


@dataclass(frozen=True)
class DecodingSettings:
    """Decoding parameters of the evaluated model (temperature 0 means greedy); the evaluator turns
    them into the engine's per-call `rollout.base.SamplingParams` (`evaluator.sampling_from`)."""

    temperature: float = 0.0
    """Sampling temperature; 0 decodes greedily (top_p/top_k are then ignored)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    top_k: int = -1
    """Top-k sampling (-1: off)."""
    repetition_penalty: float = 1.0
    """Multiplicative penalty on repeated tokens (1.0: off)."""
    presence_penalty: float = 0.0
    """Additive penalty on tokens already present (0.0: off)."""
    max_new_tokens: int = 2048
    """Response length limit, tokens."""
    seed: int = 0
    """Sampling seed (matters only when temperature > 0)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic (temperature 0)."""
        return self.temperature == 0


@dataclass
class EvalSettings:
    """Everything that changes a benchmark score. Two runs with equal hashes are comparable."""

    model_path: str
    """The evaluated model folder (as given; not resolved, so moving a folder keeps the hash)."""
    engine: str = "vllm"
    """Generation engine: `vllm` or `hf`."""
    vision: VisionConfig = field(default_factory=VisionConfig)
    """Frame sampling and pixel budgets (only its score-changing `key_params` are hashed)."""
    sampling: DecodingSettings = field(default_factory=DecodingSettings)
    """Decoding parameters."""
    prompt_template: str = "builtin"
    """Template folder used to render prompts (`builtin`: the package's own templates)."""
    prompt_digest: str = ""
    """Digest of the template files' contents (see `template_digest`), so editing a template
    changes the hash even when its path does not."""
    judge: str = ""
    """LLM judge scoring open-ended answers (model name and endpoint, as the run gives them);
    empty: the ROUGE fallback of the open-ended scorer."""
    tools: str = ""
    """Video tools the model may call (`eval --tools`, comma-separated; empty: single-turn, unhashed)."""
    sources: dict[str, Any] = field(default_factory=dict)
    """Where the settings came from (preset, the model's carried settings, flags) and the dtype;
    kept in settings.json, never hashed."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r}; choose one of {', '.join(ENGINES)}")
        if not self.model_path:
            raise ValueError("model_path is empty: the settings must name the evaluated model")

    def flat(self) -> dict[str, Any]:
        """The hashed settings as a flat {dotted key: JSON value} dict."""
        out: dict[str, Any] = {"model_path": self.model_path, "engine": self.engine,
                               "prompt_template": self.prompt_template,
                               "prompt_digest": self.prompt_digest, "judge": self.judge}
        out.update({f"vision.{k}": v for k, v in self.vision.key_params().items()})
        out.update({f"sampling.{k}": v for k, v in dataclasses.asdict(self.sampling).items()})
        if self.tools:  # only then: runs without tools keep the hashes they had
            out["tools"] = self.tools
        return json.loads(json.dumps(out))  # tuples -> lists, floats as JSON writes them

    @property
    def hash(self) -> str:
        """Hash of every setting (resume key)."""
        return settings_hash(self.flat())

    @property
    def protocol_hash(self) -> str:
        """Hash of every setting except the model (comparison key)."""
        return settings_hash(self.flat(), exclude=UNHASHED_KEYS)


def settings_hash(flat: dict[str, Any], exclude: tuple[str, ...] = ()) -> str:
    """First 16 hex digits of the SHA-256 of the canonical JSON of `flat` minus `exclude`."""
    kept = {k: v for k, v in flat.items() if k not in exclude}
    blob = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def differences(a: dict[str, Any], b: dict[str, Any], exclude: tuple[str, ...] = ()) -> list[str]:
    """One line per differing key: `key: a_value != b_value` (a missing key shows as <absent>)."""
    lines = []
    for key in sorted(set(a) | set(b)):
        if key in exclude:
            continue
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if va != vb:
            lines.append(f"{key}: {va!r} != {vb!r}")
    return lines


def template_digest(template_dir: str | os.PathLike | None = None) -> str:
    """SHA-256 prefix over the names and contents of the `*.jinja` files of a template folder
    (None: the package's built-in `easyvideor1/templates`), searched recursively; or of one
    template file, which `render_prompt` then uses for every sample (as the demo does)."""
    root = Path(template_dir) if template_dir else Path(__file__).resolve().parent.parent / "templates"
    if not root.exists():
        raise UserError(f"--template-dir {root}: no such folder or file (give a folder of *.jinja templates "
                        "or one template file)")
    h = hashlib.sha256()
    files = [root] if root.is_file() else sorted(root.rglob("*.jinja"))
    root = root.parent if root.is_file() else root
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
