"""`VLLMOutput` without vLLM, in a command's own process: a process started inside `starting()`
writes to the file for its whole life, the `vllm` logger writes there until `release()`, and the
console keeps ours only. (The vLLM
engines with it: test_vllm_tools.py in process, tests/evaluation/test_pipeline_vllm.py through eval.)"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from easyvideor1.rollout.vllm_logs import VLLMOutput

CHILD = "import sys, time; time.sleep(0.3); print('child out'); print('child err', file=sys.stderr)"
# A command's process (sys.stdout on fd 1, as `easyvideor1 eval` runs), not pytest's captured one.
SCRIPT = f"""
import logging, subprocess, sys
from easyvideor1.rollout.vllm_logs import VLLMOutput
root = logging.getLogger("vllm")
output = VLLMOutput(sys.argv[1])
with output.starting():
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])  # writes after the block
    print("inside")
    theirs = logging.StreamHandler(sys.stdout)  # vLLM configures its logger while building
    root.handlers, root.propagate = [theirs], False
print("ours")
child.wait()
logging.getLogger("vllm.engine_test").warning("vllm after the block")
output.release()
assert root.handlers == [theirs]
print("ours again", file=sys.stderr)
"""


def test_what_starts_inside_writes_to_the_file_and_ours_to_the_console(tmp_path):
    log_file = tmp_path / "new" / "vllm.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log_file)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr) == ("ours\n", "ours again\n")
    text = log_file.read_text()
    for line in ("inside", "child out", "child err", "vllm after the block"):
        assert line in text, text


def test_none_changes_nothing_and_an_error_names_the_file(tmp_path, capfd):
    with VLLMOutput(None).starting():
        print("shown")
    assert capfd.readouterr().out == "shown\n"
    with pytest.raises(RuntimeError) as e, VLLMOutput(tmp_path / "vllm.log").starting():
        raise RuntimeError("engine failed")
    assert f"vLLM's log: {tmp_path / 'vllm.log'}" in e.value.__notes__
