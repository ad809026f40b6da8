"""tests/conftest.py fails a test, or a module, that leaves a torch.distributed process group alive
in its worker (issue 54: a group inherited by a later fork crashed a cache worker), and leaves the
group so the next test starts clean; a group a fixture holds while its tests run (an in-process vLLM
engine's) passes. A real pytest run over planted files, with the suite's conftest."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

HELD_BY_A_FIXTURE = '''
import pytest
import torch
import torch.distributed as dist

@pytest.fixture(scope="module")
def held():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()

def test_a_fixture_holds_a_group(held):
    assert dist.is_initialized()

def test_and_another_test_uses_it(held):
    dist.all_reduce(torch.ones(1))
'''

LEFT_BY_A_TEST = '''
import torch.distributed as dist

def test_leaves_a_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

def test_the_next_starts_clean():
    assert not dist.is_initialized()
'''

LEFT_BY_A_MODULE_FIXTURE = '''
import pytest
import torch.distributed as dist

@pytest.fixture(scope="module")
def never_left():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

def test_its_tests_pass(never_left):
    assert dist.is_initialized()
'''


def test_a_left_group_fails_its_test_or_module_and_the_next_starts_clean(tmp_path):
    for name in ("conftest.py", "budget.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    for name, text in (("test_a_held.py", HELD_BY_A_FIXTURE), ("test_b_left.py", LEFT_BY_A_TEST),
                       ("test_c_module.py", LEFT_BY_A_MODULE_FIXTURE)):
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:randomly", "-rfE", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert re.search(r"1 failed, 4 passed, 1 error", out), out
    assert "AssertionError: the test test_b_left.py::test_leaves_a_group left a torch.distributed process group " \
           "alive" in out, out
    assert "ERROR at teardown of test_its_tests_pass" in out, out
    assert "the module test_c_module.py (a fixture of it) left a torch.distributed process group alive" in out, out
    assert "FAILED test_b_left.py::test_leaves_a_group" in out and "ERROR test_c_module.py::test_its_tests_pass" in out
