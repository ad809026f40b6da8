"""scripts/setup.sh runs in numbered steps from one list, and `--plan` prints that list (installing
nothing): every pip call of the script is one of those steps, so a new install cannot run unlisted
and unnumbered (tests do not run a real set-up: minutes, and the venv is in use)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "setup.sh"


def _logical_lines(text: str) -> list[str]:
    """The script's commands: comments dropped, backslash-continued lines joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [line.strip() for line in "\n".join(lines).replace("\\\n", "").splitlines() if line.strip()]


def _plan(*args: str) -> tuple[list[tuple[int, str, str]], str]:
    proc = subprocess.run(["bash", str(SCRIPT), *args, "--plan"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^  (\d+)\. (.+)\n {7}\$ (.+)$", proc.stdout, flags=re.M)
    return [(int(n), label, cmd) for n, label, cmd in listed], proc.stdout


def test_every_pip_call_is_a_step_that_plan_lists():
    text = SCRIPT.read_text(encoding="utf-8")
    # one place runs pip (the wrapper that shows its output), one place runs apt-get install
    wrapper = re.search(r"^pip_\(\) \{\n.*?^\}", text, flags=re.S | re.M)
    assert wrapper and text.count("-m pip") == wrapper[0].count("-m pip") > 0
    apt = re.search(r"^apt_install\(\) \{\n.*?^\}", text, flags=re.S | re.M)
    assert apt and text.count("apt-get install") == apt[0].count("apt-get install") == 1
    calls = [line for line in _logical_lines(text)
             if re.search(r"\b(pip_install|pip_uninstall|apt_install)\b", line) and "() {" not in line]
    planned = {cmd for variant in ("cpu", "gpu") for _, _, cmd in _plan(variant)[0]}
    assert len(calls) >= 4
    for line in calls:
        words = shlex.split(line)
        assert words[0] == "step", f"not a numbered step: {line}"
        assert " ".join(words[3:]) in planned, f"--plan does not list: {line}"


def test_plan_numbers_the_steps_and_installs_nothing():
    for variant, pins in (("cpu", ("torch==2.13.0", "torchcodec==0.13.0", ".[cpu,dev]")), ("gpu", (".[dev]",))):
        steps, out = _plan(variant)
        assert [n for n, _, _ in steps] == list(range(1, len(steps) + 1)), out
        commands = " ".join(cmd for _, _, cmd in steps)
        assert all(pin in commands for pin in pins), out
        assert "[setup] a run now:" in out.splitlines()[-1]
    proc = subprocess.run(["bash", str(SCRIPT), "--plann"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: scripts/setup.sh" in proc.stderr


@pytest.mark.skipif(not (shutil.which("ffmpeg") and shutil.which("chromium")),
                    reason="a run would install the Debian packages first")
def test_an_up_to_date_venv_is_a_silent_no_op(tmp_path):
    """In a copy of the checkout whose .venv carries the stamp --plan names, a run prints nothing,
    installs nothing and exits 0; a changed requirement makes it a run of the pip steps again."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    script = ["bash", str(tmp_path / "scripts" / "setup.sh")]

    def plan() -> str:
        return subprocess.run(script + ["--plan"], capture_output=True, text=True, timeout=60, check=True).stdout

    want = re.search(r"the requirements hash to (\S+);", plan())[1]
    (tmp_path / ".venv" / ".easyvideor1-setup").write_text(want + "\n")
    run = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")
    assert plan().splitlines()[-1] == "[setup] a run now: nothing to do (.venv is up to date)"
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + "\n# changed\n")
    assert plan().splitlines()[-1] == "[setup] a run now: 5 step(s)"
