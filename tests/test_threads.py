"""The threading policy each command sets before torch is imported (`easyvideor1.threads`,
applied by `cli.main`), checked in real subprocesses: what torch ends up with."""

import json
import os
import subprocess
import sys

from easyvideor1.threads import intra_op_threads, usable_cores

# Runs one command through the real entry point, then reports what the process runs with.
# A command that fails on purpose (exit 2: no such data file) has applied the policy already.
PROBE = """
import json, os, sys
from easyvideor1 import cli
rc = cli.main(sys.argv[1:])
import torch
print(json.dumps({"rc": rc, "wait": os.environ.get("OMP_WAIT_POLICY"),
                  "omp": os.environ.get("OMP_NUM_THREADS"), "torch": torch.get_num_threads()}))
"""


# The child gets a fresh environment, as from a shell: earlier tests in this process (vLLM's
# engine, for one) leave threading variables behind that a user's shell does not have.
KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


def _run(args, tmp_path, **env_set):
    env = {k: os.environ[k] for k in KEEP if k in os.environ}
    env.update(env_set, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cores_left_after_workers():
    assert intra_op_threads(8, 0) == 8
    assert intra_op_threads(8, 3) == 5
    assert intra_op_threads(2, 4) == 1  # never below one
    assert intra_op_threads(8, 0, local_ranks=4) == 2  # torchrun: the node's cores split among its ranks


def test_command_without_workers_gets_every_core_and_passive_waiting(tmp_path):
    got = _run(["tiny-model", "--family", "qwen2_vl", "--out", str(tmp_path / "m")], tmp_path)
    assert got["rc"] == 0
    assert got["wait"] == "PASSIVE"
    assert int(got["omp"]) == got["torch"] == usable_cores()


def test_worker_processes_are_left_their_cores(tmp_path):
    # cache --workers 1: torch gets the other cores (on a 1-core machine: still 1). torch reads
    # OMP_NUM_THREADS at import only, so this also shows the policy came before torch.
    got = _run(["cache", "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "c"), "--workers", "1"],
               tmp_path)
    assert got["rc"] == 2  # no such data file: a user error, after the policy was set
    assert int(got["omp"]) == got["torch"] == max(1, usable_cores() - 1)


def test_torchrun_ranks_share_the_cores(tmp_path):
    got = _run(["tiny-model", "--family", "qwen2_vl", "--out", str(tmp_path / "m")], tmp_path, LOCAL_WORLD_SIZE="2")
    assert got["torch"] == max(1, usable_cores() // 2)


def test_user_settings_are_kept(tmp_path):
    got = _run(["tiny-model", "--family", "qwen2_vl", "--out", str(tmp_path / "m")], tmp_path, OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="1")
    assert got["wait"] == "ACTIVE"
    assert got["omp"] == "1" and got["torch"] == 1


def test_help_says_so():
    from easyvideor1.cli import build_parser

    assert "OMP_WAIT_POLICY=PASSIVE" in build_parser().format_help()


def test_the_demo_runs_one_thread(tmp_path):
    # a wrong override: a user error (exit 2) after the policy was set, before any model is built
    got = _run(["demo", "--out", str(tmp_path / "d"), "training.no_such_field=1"], tmp_path)
    assert got["rc"] == 2
    assert got["omp"] == "1" and got["torch"] == 1
    got = _run(["demo", "--out", str(tmp_path / "d"), "training.no_such_field=1"], tmp_path, OMP_NUM_THREADS="2")
    assert got["omp"] == "2" and got["torch"] == 2  # the user's setting is kept
