"""Run untrusted Python (a model's answer) against tests in a throwaway, limited subprocess.

Layers, none of which runs response code in the caller's process:
- a fresh `python -I -S` (isolated: no site-packages, no PYTHONPATH, no user site), in a
  temporary directory that is deleted afterwards, with a minimal environment;
- resource limits set by the harness before the code runs: address space (`memory_mb`), CPU
  seconds, file size (16 MB, stdout included), no core dumps; a wall-clock kill at `timeout_s`
  (the batch pool kills a timed-out worker's whole process group, this child included);
- no network: a new network namespace (`unshare -rn`) where the kernel allows it, and in every
  case an audit hook that refuses sockets, subprocesses, fork/exec, ctypes, signals to other
  processes, frame/GC introspection, and file writes outside the temporary directory;
- results travel as lines tagged with a random nonce the code cannot see, so printing
  "PASS" does not pass a test, and exiting early fails the remaining ones.
This is a best-effort sandbox for RL rewards, not a security boundary: run untrusted code at
scale inside a container or VM as well.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache

_HARNESS = r"""
import sys, os, json, resource
def _run():
    nonce = sys.stdin.readline().strip()
    job = json.loads(sys.stdin.read())
    mem = job["memory_mb"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(job["cpu_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    root = os.path.realpath(os.getcwd())
    write = os.write
    blocked = {"socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo",
               "socket.sendto", "subprocess.Popen", "os.system", "os.exec", "os.spawn",
               "os.posix_spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
               "signal.pthread_kill", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
               "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
               "object.__getattr__", "gc.get_objects", "gc.get_referrers",
               "gc.get_referents", "sys.addaudithook", "os.chdir", "os.putenv",
               "resource.setrlimit", "resource.prlimit", "pty.spawn"}
    modules = {"socket", "_socket", "ssl", "_ssl", "subprocess", "_posixsubprocess",
               "ctypes", "_ctypes", "multiprocessing", "_multiprocessing", "pty", "mmap"}
    paths = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
             "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree"}
    def inside(path):
        try:
            real = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return real == root or real.startswith(root + os.sep)
    def hook(event, args):
        if event in blocked:
            raise PermissionError("sandbox: " + event + " is not allowed")
        if event == "import" and str(args[0]).split(".")[0] in modules:
            raise PermissionError("sandbox: importing " + str(args[0]) + " is not allowed")
        if event in paths and args and isinstance(args[0], (str, bytes)) and not inside(args[0]):
            raise PermissionError("sandbox: " + event + " outside the work directory")
        if event == "open" and isinstance(args[0], (str, bytes)):
            mode, flags = args[1] or "r", args[2] or 0
            writing = any(c in str(mode) for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if writing and not inside(args[0]):
                raise PermissionError("sandbox: writing outside the work directory")
    sys.addaudithook(hook)
    namespace = {"__name__": "__solution__", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "<response>", "exec"), namespace)
    except BaseException as e:
        write(1, (nonce + " SETUP " + type(e).__name__ + "\n").encode())
        return
    for i, test in enumerate(job["tests"]):
        try:
            exec(compile(test, "<test %d>" % i, "exec"), dict(namespace))
            ok = "PASS"
        except BaseException:
            ok = "FAIL"
        write(1, (nonce + " " + ok + " %d\n" % i).encode())
_run()
"""


@dataclass
class SandboxRun:
    """Outcome of one sandboxed run: which tests passed, and why it stopped if it did."""

    passed: list[bool]
    timed_out: bool = False
    setup_error: str | None = None  # exception type when the response code itself failed
    output_tail: str = ""  # last bytes of stdout/stderr, for debugging


@lru_cache(maxsize=1)
def network_namespace_prefix() -> tuple[str, ...]:
    """`("unshare", "-rn")` when an unprivileged network namespace works here, else ()."""
    tool = shutil.which("unshare")
    if tool is None:
        return ()
    try:
        ok = subprocess.run([tool, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (tool, "-rn") if ok else ()


def run_python(
    code: str, tests: list[str], timeout_s: float = 10.0, memory_mb: int = 1024
) -> SandboxRun:
    """Run `code`, then each test snippet in a copy of its namespace; a test passes if it raises nothing."""
    nonce = secrets.token_hex(16)
    job = json.dumps({"code": code, "tests": tests, "memory_mb": memory_mb, "cpu_s": timeout_s})
    with tempfile.TemporaryDirectory(prefix="ev1-sandbox-") as work:
        out_path = os.path.join(work, ".out")
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        cmd = [*network_namespace_prefix(), sys.executable, "-I", "-S", "-c", _HARNESS]
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=work, env=env, stdin=subprocess.PIPE, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            timed_out = False
            try:
                proc.communicate((nonce + "\n" + job).encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                proc.kill()  # it cannot have children (fork/exec are refused), so this is all of it
                proc.wait()
        with open(out_path, "rb") as f:
            data = f.read(32 << 20)
    return _parse(data.decode("utf-8", "replace"), nonce, len(tests), timed_out)


def _parse(text: str, nonce: str, n_tests: int, timed_out: bool) -> SandboxRun:
    passed = [False] * n_tests
    setup_error = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 3 or fields[0] != nonce:
            continue
        if fields[1] == "SETUP":
            setup_error = fields[2]
        elif fields[1] == "PASS" and fields[2].isdigit() and int(fields[2]) < n_tests:
            passed[int(fields[2])] = True
    return SandboxRun(passed, timed_out, setup_error, text[-2000:].replace(nonce, "<nonce>"))
