"""tests/forkserver.py: a child of the fork server behaves as the fresh process it replaces
(argv, folder, environment, streams, exit status, signals, exit-time work), and what it cannot
give goes to `subprocess`."""

import json
import os
import signal
import subprocess
import sys

import pytest

import forkserver


def _py(code, *args):
    return [sys.executable, "-c", code, *args]


def _launched():
    """Commands that went to a server, torchrun's ranks left out: a server's ranks are counted when
    it stops, which a launch that needs a server for a new environment can cause (it stops an idle
    one), so they can grow by any number during one `run`."""
    return sum(n for kind, n in forkserver.LAUNCHED.items() if kind != "rank")


def test_argv_folder_environment_streams_and_exit_status(tmp_path):
    before = _launched()
    code = ("import os, sys; print(sys.argv, os.getcwd(), os.environ['EV1_PROBE'], sys.path[0] == '');"
            "print('to stderr', file=sys.stderr); sys.exit(3)")
    p = forkserver.run(_py(code, "a", "b c"), cwd=tmp_path, env={**os.environ, "EV1_PROBE": "x1"},
                       capture_output=True, text=True, timeout=600)
    assert _launched() == before + 1, forkserver.FALLBACKS  # it went to the server
    assert p.returncode == 3
    assert p.stdout == f"['-c', 'a', 'b c'] {tmp_path} x1 True\n" and p.stderr == "to stderr\n"
    with forkserver.Popen(_py("print(1)"), stdout=subprocess.PIPE) as proc:
        assert proc.stdout.read() == b"1\n"
    assert proc.returncode == 0 and proc.cpu_s > 0


def test_uncaught_exception_prints_its_traceback_and_exits_1():
    p = forkserver.run(_py("raise ValueError('bad input 17')"), capture_output=True, text=True, timeout=600)
    assert p.returncode == 1
    assert "Traceback (most recent call last)" in p.stderr and "ValueError: bad input 17" in p.stderr


def test_signals_reach_the_child_and_its_status_says_so():
    p = forkserver.run(_py("import os, signal; os.kill(os.getpid(), signal.SIGABRT)"), capture_output=True,
                       timeout=600)
    assert p.returncode == -signal.SIGABRT
    with forkserver.Popen(_py("import time; print('up', flush=True); time.sleep(600)"), stdout=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdout.readline() == "up\n"
        assert proc.poll() is None
        proc.terminate()
    assert proc.returncode == -signal.SIGTERM
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(_py("import time; time.sleep(600)"), timeout=0.5)


def test_the_child_ends_through_the_interpreters_shutdown(tmp_path):
    """Non-daemon threads are joined and atexit handlers run before the status is reported, as
    in a fresh interpreter (the exit-time path issue 25 is about)."""
    code = ("import atexit, threading, time, sys\n"
            "atexit.register(lambda: print('atexit ran', flush=True))\n"
            "def late():\n"
            "    time.sleep(0.3)\n"
            f"    open({str(tmp_path / 'late')!r}, 'w').write('done')\n"
            "threading.Thread(target=late).start()\n"
            "sys.exit(0)\n")
    p = forkserver.run(_py(code), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout == "atexit ran\n", p.stderr
    assert (tmp_path / "late").read_text() == "done"


def test_the_code_under_test_is_imported_by_the_child_not_the_server():
    """The server holds the same project modules as a fresh interpreter (the torchvision hook's
    package) and no more: the child imports the code under test from disk."""
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('easyvideor1')), 'torch' in sys.modules)"
    fresh = subprocess.run(_py(code), capture_output=True, text=True, timeout=600)
    forked = forkserver.run(_py(code), capture_output=True, text=True, timeout=600)
    assert forked.stdout == fresh.stdout.replace("False", "True"), (forked.stdout, fresh.stdout)


def test_a_cli_server_has_imported_no_torch():
    """test_cli_errors asserts that a wrong argument is answered before torch, transformers or vLLM
    is imported: its children come from a server that has imported none of them, and a child that
    imports torch itself shows it."""
    code = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm')))"
    p = forkserver.run(_py(code), capture_output=True, text=True, timeout=600, preload="cli")
    assert p.stdout == "[]\n", p.stderr
    p = forkserver.run(_py("import torch; " + code), capture_output=True, text=True, timeout=600, preload="cli")
    assert "'torch'" in p.stdout, p.stderr
    p = forkserver.run(_py(code), capture_output=True, text=True, timeout=600)
    assert "'transformers'" in p.stdout and "'torch'" in p.stdout, p.stderr  # the full server's, for contrast


def test_module_script_and_pythonpath_as_the_interpreter_sets_them(tmp_path):
    pkg = tmp_path / "lib" / "probepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text("import sys, os\nprint(__name__, os.path.basename(sys.argv[0]), sys.argv[1:], "
                                 "sys.path[0] == os.getcwd())\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lib")}
    p = forkserver.run([sys.executable, "-m", "probepkg.tool", "x"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert p.stdout == "__main__ tool.py ['x'] True\n", p.stderr
    script = tmp_path / "bin" / "s.py"
    script.parent.mkdir()
    script.write_text(f"import sys; print(sys.path[0] == {str(script.parent)!r}, sys.argv[1:])")
    p = forkserver.run([sys.executable, str(script), "y"], capture_output=True, text=True, timeout=600)
    assert p.stdout == "True ['y']\n", p.stderr
    p = forkserver.run(_py("import os; print(os.getsid(0) == os.getpid())"), start_new_session=True,
                       capture_output=True, text=True, timeout=600)
    assert p.stdout == "True\n"


def test_a_variable_read_at_import_gets_a_server_of_its_own():
    """OMP_NUM_THREADS sets torch's thread pool when torch is imported: a child asking for another
    value than its server's gets a server started with it, and the value it asked for."""
    code = _py("import torch; print(torch.get_num_threads())")
    same = forkserver.run(code, capture_output=True, text=True, timeout=600).stdout
    threads = "2" if same.strip() == "1" else "1"
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    started = forkserver.SERVERS_STARTED[0]
    p = forkserver.run(code, env=env, capture_output=True, text=True, timeout=600)
    assert p.stdout == subprocess.run(code, env=env, capture_output=True, text=True, timeout=600).stdout != same
    assert forkserver.SERVERS_STARTED[0] == started + 1
    forkserver.run(code, env=env, capture_output=True, text=True, timeout=600)
    assert forkserver.SERVERS_STARTED[0] == started + 1  # and keeps it


def test_what_a_preloaded_parent_cannot_give_starts_fresh():
    before = forkserver.FALLBACKS["interpreter option -X"]
    p = forkserver.run([sys.executable, "-X", "utf8", "-c", "import sys; print(sys.flags.utf8_mode)"],
                       capture_output=True, text=True, timeout=600)
    assert p.stdout == "1\n" and forkserver.FALLBACKS["interpreter option -X"] == before + 1


RANK_SCRIPT = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.path.join(sys.argv[1], f"pid{rank}"), "w").write(str(os.getpid()))
t = __import__("torch").tensor([rank + 1.0])
dist.all_reduce(t)
sys.stdout.write(f"rank {rank} sum {t.item():g} unbuffered {sys.stdout.write_through}\\n")  # one write: whole lines
if sys.argv[2] == "fail":
    dist.barrier()
    if rank == 1:
        sys.exit(3)
    time.sleep(600)  # torchrun ends this rank when rank 1 fails
dist.destroy_process_group()
"""


def _torchrun(tmp_path, mode):
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    return forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path), mode], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    # (torchrun sets OMP_NUM_THREADS for its ranks when it is unset: a rank would then differ from its server)


def test_torchrun_ranks_start_through_the_server(tmp_path):
    forkserver.close_server()  # the ranks' notes are read when a server stops: those of earlier tests now
    before = forkserver.LAUNCHED.copy()
    p = _torchrun(tmp_path, "ok")
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(line for line in p.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 sum 3 unbuffered True", "rank 1 sum 3 unbuffered True"]
    forkserver.close_server()
    assert forkserver.LAUNCHED["rank"] == before["rank"] + 2, (forkserver.LAUNCHED, forkserver.FALLBACKS)


def test_a_failed_rank_ends_the_run_and_its_sleeping_peer(tmp_path):
    """Rank 1 exits 3: torchrun reports it and signals rank 0, which the stand-in passes on; no
    rank is left behind."""
    p = _torchrun(tmp_path, "fail")
    assert p.returncode != 0
    assert "exitcode  : 3" in p.stderr, p.stderr[-3000:]
    for rank in (0, 1):
        pid = int((tmp_path / f"pid{rank}").read_text())
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"


ORDER_SCRIPT = """
import json, os, sys
fresh = "transformers" not in sys.modules  # a forked rank has the server's imports
from easyvideor1.records import Sample
from easyvideor1.training.loader import PromptLoader
samples = [Sample("q", "a", "free_form", problem_id=f"clip-{k}") for k in range(8)]
os.environ.pop("EASYVIDEOR1_TEST_HOOK", None)
plain = [s.problem_id for s in PromptLoader(samples, 4, shuffle=False).next_batch()]
os.environ["EASYVIDEOR1_TEST_HOOK"] = "loader.set_order:1:on"  # the planted bug (easyvideor1.testhooks)
planted = [s.problem_id for s in PromptLoader(samples, 4, shuffle=False).next_batch()]
rank = os.environ["RANK"]
open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w").write(json.dumps({
    "seed": os.environ.get("PYTHONHASHSEED"), "hash": hash("ev1"), "fresh": fresh,
    "unbuffered": sys.stdout.write_through, "plain": plain, "planted": planted}))
"""
HASH_SEED = 5  # ranks 5 and 6: the planted set order differs between them (checked below)


def test_hash_seed_ranks_have_secrets_of_their_own_and_show_a_set_order_bug(tmp_path):
    """A fork keeps its parent's string-hash secret: forked ranks iterate a set of strings alike,
    where a user's ranks each have their own secret. With `hash_seed` each rank is a fresh
    interpreter with PYTHONHASHSEED=seed+RANK, and the planted bug (the loader ordering its
    samples as a set of their ids iterates) makes the ranks disagree on the batch, as they
    would for a user; forked ranks agree and hide it."""
    script = tmp_path / "order.py"
    script.write_text(ORDER_SCRIPT)

    def ranks(name, **how):
        out = tmp_path / name
        out.mkdir()
        p = forkserver.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(script), str(out)], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}, **how)
        assert p.returncode == 0, p.stdout + p.stderr[-3000:]
        return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]

    fresh = ranks("fresh", hash_seed=HASH_SEED)
    assert [r["seed"] for r in fresh] == [str(HASH_SEED), str(HASH_SEED + 1)]
    assert all(r["fresh"] and r["unbuffered"] for r in fresh)
    assert fresh[0]["hash"] != fresh[1]["hash"]
    assert fresh[0]["plain"] == fresh[1]["plain"]  # the loader's own order is the same on every rank
    assert fresh[0]["planted"] != fresh[1]["planted"]  # the planted bug shows
    forked = ranks("forked")
    assert not any(r["fresh"] for r in forked)
    assert forked[0]["hash"] == forked[1]["hash"] and forked[0]["planted"] == forked[1]["planted"]  # hidden
    # a one-process command: a fresh interpreter with that secret (rank 1's above)
    p = forkserver.run(_py("import os; print(os.environ['PYTHONHASHSEED'], hash('ev1'))"), hash_seed=HASH_SEED + 1,
                       capture_output=True, text=True, timeout=600)
    assert p.stdout == f"{HASH_SEED + 1} {fresh[1]['hash']}\n", p.stderr
