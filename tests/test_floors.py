"""The version floors of pyproject.toml are versions a test ran on.

Always (no network): every runtime dependency declares a floor (`>=`), none is above the version
.venv holds, and the floors the floors job installs (`FLOORS`) are pyproject's own. The floors not
in `FLOORS` are the versions .venv held when they were set: the whole suite ran on them.

With `EASYVIDEOR1_FLOORS=1` (the floors job, docs/getting-started.md): builds a second venv,
`.venv/floors`, that holds `FLOORS` (and `HELPERS`, what those need at their own floors) from PyPI
and takes everything else from .venv (a .pth file, so torch and vllm are not downloaded again),
then runs the start-up, meta-init, export, attention and HF-engine test files there, each in its
own pytest process. A second run reuses the venv while `FLOORS` and `HELPERS` are unchanged.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ENV = "EASYVIDEOR1_FLOORS"

FLOORS = {"transformers": "5.17.0", "tokenizers": "0.23.1", "safetensors": "0.8.0", "peft": "0.21.0"}
"""What the floors job installs: pyproject's floors of the libraries whose private or recent APIs
the code uses (transformers' weight-conversion loaders, safetensors' `backend="pread"`, tokenizers'
`DecodeStream(ids=)`, peft's LoRA internals). 5.17 is the GPU image's transformers."""
HELPERS = {"huggingface-hub": "1.33.0"}
"""Not dependencies of ours: transformers 5.17 needs huggingface-hub < 2.0 (.venv has 2.x)."""
FLOOR_TESTS = (
    "tests/models/test_meta_init.py",  # meta init: rename_source_key, get_model_conversion_mapping, pread
    "tests/training/test_export_stream.py",  # export: revert_weight_conversion, sharded safetensors
    "tests/training/test_train_command.py",  # start-up: `easyvideor1 train` end to end, HF export
    "tests/models/test_model_loading.py",  # policy and reference loading
    "tests/models/test_vision_attention.py",  # the vision attention registered by name
    "tests/models/test_attention_calls.py",  # every SDPA call of a training step
    "tests/rollout/test_hf_engine.py",  # generation, stop strings (DecodeStream)
    "tests/rollout/test_rollout_sampling.py",
)


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def _floor(req: Requirement) -> str | None:
    return next((s.version for s in req.specifier if s.operator == ">="), None)


def test_every_runtime_dependency_has_a_floor_this_venv_meets():
    for req in _runtime_requirements():
        floor = _floor(req)
        assert floor, f"pyproject.toml: {req} has no floor (>=): give it the version a test ran on"
        installed = importlib.metadata.version(req.name)
        assert Version(installed) >= Version(floor), f"{req}: .venv holds {installed}, below the floor"


def test_the_floors_job_installs_the_declared_floors():
    floors = {req.name: _floor(req) for req in _runtime_requirements()}
    for name, version in FLOORS.items():
        assert Version(floors[name]) == Version(version), f"pyproject.toml's floor of {name} is {floors[name]}, " \
                                                          f"the floors job runs {version}"


# -- the floors job ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def floors_python() -> Path:
    """.venv/floors/bin/python: `FLOORS` and `HELPERS` first, then .venv's packages."""
    if os.environ.get(ENV) != "1":
        pytest.skip(f"the floors job builds a second venv from PyPI: {ENV}=1 runs it")
    if sys.prefix == sys.base_prefix:
        pytest.skip("run from the project's venv (.venv/bin/python -m pytest ...)")
    folder = Path(sys.prefix) / "floors"
    python = folder / "bin" / "python"
    pins = [f"{name}=={version}" for name, version in {**FLOORS, **HELPERS}.items()]
    purelib = sysconfig.get_paths()["purelib"]
    stamp = json.dumps({"pins": pins, "base": purelib, "python": sys.version})
    if not (python.exists() and (folder / "stamp.json").exists() and (folder / "stamp.json").read_text() == stamp):
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
        # --no-deps: the pins are the whole set (the rest is .venv's, seen only after the install,
        # so pip never touches .venv)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                        "--progress-bar", "off", "--quiet", *pins], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        # addsitedir, not a bare path: .venv's own .pth files (the editable easyvideor1) run too
        Path(site, "_easyvideor1_base_venv.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
        (folder / "stamp.json").write_text(stamp)
    return python


def test_the_floors_venv_holds_the_floors(floors_python):
    script = ("import importlib.metadata as m, json, transformers, peft; "
              f"print(json.dumps([{{n: m.version(n) for n in {list({**FLOORS, **HELPERS})}}}, "
              "transformers.__version__, peft.__version__]))")
    versions, transformers, peft = json.loads(subprocess.run(
        [str(floors_python), "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    assert versions == {**FLOORS, **HELPERS}
    assert (transformers, peft) == (FLOORS["transformers"], FLOORS["peft"])  # the modules imported, too


@pytest.mark.parametrize("test_file", FLOOR_TESTS)
def test_at_the_floors(floors_python, test_file):
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    env.pop(ENV)
    proc = subprocess.run([str(floors_python), "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{test_file} at the floors ({FLOORS}):\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
