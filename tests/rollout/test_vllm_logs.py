"""`VLLMOutput` without vLLM: a process started inside `starting()` writes to the file for its whole
life, the `vllm` logger writes there until `release()`, and the console keeps ours only. (The vLLM
engines with it: test_vllm_tools.py in process, tests/evaluation/test_pipeline_vllm.py through eval.)"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from easyvideor1.rollout.vllm_logs import VLLMOutput

CHILD = "import sys, time; time.sleep(0.3); print('child out'); print('child err', file=sys.stderr)"


def test_what_starts_inside_writes_to_the_file_and_ours_to_the_console(tmp_path, capfd):
    log_file = tmp_path / "new" / "vllm.log"
    root = logging.getLogger("vllm")
    before = root.handlers, root.propagate
    output = VLLMOutput(log_file)
    try:
        with output.starting():
            child = subprocess.Popen([sys.executable, "-c", CHILD])  # writes after the block
            print("inside")
            theirs = logging.StreamHandler(sys.stdout)  # vLLM configures its logger while building
            root.handlers, root.propagate = [theirs], False
        print("ours")
        child.wait()
        logging.getLogger("vllm.engine_test").warning("vllm after the block")
        output.release()
        assert root.handlers == [theirs]
    finally:
        root.handlers, root.propagate = before
    out, err = capfd.readouterr()
    assert out == "ours\n" and "child" not in err and "vllm after" not in err, (out, err)
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
