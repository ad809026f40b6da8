"""Start the tests' Python subprocesses without paying their imports each time (issue 25).

A one-process `python -m easyvideor1.cli train ...` in a test spends ~6 of its ~10 CPU-seconds
importing torch, transformers, the Qwen-VL model files and torchcodec before it does any work; the
suite starts ~230 such processes (torchrun ranks included). `run` and `Popen` here take the same
arguments as `subprocess.run` / `subprocess.Popen`. For a command `[sys.executable, -m MODULE |
-c CODE | SCRIPT, *args]` they ask a server process of this pytest worker, which has those
libraries imported, to fork a child that becomes that command:

- the child gets the caller's stdin/stdout/stderr file descriptors (sent over a UNIX socket), its
  environment, working folder and argv, and runs the module, code or script as `__main__` the way
  the interpreter does (`runpy._run_module_as_main` for -m);
- nothing is caught: an exception prints its traceback and exits 1, `SystemExit` sets the code,
  and the child ends through the interpreter's normal shutdown (non-daemon threads joined, atexit
  handlers, finalisation), so exit-time behaviour is that of a fresh process;
- its pid is a real pid (`kill`, `send_signal` and signals from the test reach it) and its exit
  status is reported by the server, which is its parent: -N when a signal ended it.

A server's imports read some environment variables (OMP_NUM_THREADS, HF_HUB_OFFLINE,
TORCHINDUCTOR_COMPILE_THREADS, LD_PRELOAD ...), so there is one server per set of those values,
started with the environment of the first command that needs it; only variables the libraries
read later (EASYVIDEOR1_*, EV1_*, VLLM_*, the torch.distributed ones) and PYTHONPATH may differ
between a server and its child. The ranks of a torchrun command start the same way
(forkserver_rank.py). Interpreter options (-u, -X, -B ...), stdin=PIPE/input, or Popen options
beyond the common ones get a fresh interpreter through `subprocess` itself (`FALLBACKS` counts why).
Tests whose result depends on its memory (peak RSS) call `subprocess` directly; those that check
what a process imports ask for a server that has imported only what that allows
(`preload="cli"`: no torch, transformers or vLLM). The server imports no easyvideor1 module:
the code under test is always imported fresh by the child. `EV1_TEST_FORKSERVER=0` turns the
server off (every call then goes to `subprocess`).

A fork keeps its parent's string-hash secret, so every forked child (every rank, both halves of a
resume) iterates a `set` of strings in one order, where a user's processes each draw a secret of
their own. `hash_seed=N` gives a command what users get, reproducibly: a fresh interpreter with
PYTHONHASHSEED=N, or for torchrun, ranks that are fresh interpreters with PYTHONHASHSEED=N+RANK
each (hashseed_rank.py; the agent is still forked).
"""

from __future__ import annotations

import atexit
import collections
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

# Imported by the server before it forks: what a training/eval/cache command imports from outside
# easyvideor1 (measured with sys.modules at the end of a test-sized `train`), minus vLLM, whose
# import configures logging from environment variables.
PRELOAD = (
    "numpy", "yaml", "jinja2", "PIL.Image", "safetensors.torch", "tqdm", "matplotlib", "matplotlib.pyplot",
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.checkpoint",
    "torch.distributed.tensor", "torch.nn.attention.flex_attention", "torchcodec.decoders", "av",
    "transformers", "transformers.modeling_utils", "transformers.processing_utils",
    "transformers.models.qwen2_vl.modeling_qwen2_vl", "transformers.models.qwen2_vl.processing_qwen2_vl",
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "transformers.models.qwen2_5_vl.processing_qwen2_5_vl",
    "transformers.models.qwen3_vl.modeling_qwen3_vl", "transformers.models.qwen3_vl.processing_qwen3_vl",
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl_fast",
    "transformers.models.qwen2_vl.video_processing_qwen2_vl",
    "transformers.models.qwen3_vl.video_processing_qwen3_vl",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl", "transformers.models.qwen2.tokenization_qwen2_fast",
    "transformers.tokenization_mistral_common", "transformers.models.auto.video_processing_auto",
    "torchvision.transforms.v2.functional", "torch.distributed.checkpoint.state_dict", "torch.profiler",
    "matplotlib.backends.backend_agg", "cv2", "requests", "pydantic", "mistral_common", "tiktoken", "peft",
)
# For commands that must not import torch (`Popen(..., preload="cli")`: test_cli_errors checks that
# a wrong argument is answered before torch, transformers or vLLM is imported): what `easyvideor1`'s
# command line imports from outside the package up to its checks.
PRELOADS = {"full": PRELOAD, "cli": ("numpy", "yaml", "tokenizers", "jinja2", "PIL.Image", "tqdm")}

# Environment variables a child may set differently from its server: read by the code under test,
# by torch.distributed at init, or by libraries the server does not import. Any other difference
# (a variable read at import: OMP_NUM_THREADS, HF_HUB_OFFLINE, TORCHINDUCTOR_COMPILE_THREADS that
# vLLM's import sets, LD_PRELOAD ...) gets a server of its own, started with that environment.
CHILD_ENV_PREFIXES = ("EASYVIDEOR1_", "EV1_", "VLLM_", "PYTEST_", "TORCHELASTIC_", "GLOO_", "NCCL_")
CHILD_ENV_KEYS = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "GROUP_WORLD_SIZE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM", "TMPDIR", "PWD", "OLDPWD", "COLUMNS", "LINES",
    "PYTHONPATH",  # the child rebuilds sys.path from it as the interpreter does at start-up
    "LD_LIBRARY_PATH",  # read by the loader when a program starts only (cv2's import prepends to it)
    "TORCHINDUCTOR_CACHE_DIR",  # read when inductor compiles; torchrun's agent sets it for its ranks
})
POPEN_OPTIONS = frozenset({"stdout", "stderr", "stdin", "env", "cwd", "text", "universal_newlines",
                           "encoding", "errors", "bufsize", "close_fds", "start_new_session"})
MAX_SERVERS = 3  # per test process and preload (~0.5 GiB each "full"); the least recently used idle one makes room

LAUNCHED: collections.Counter = collections.Counter()  # what went to a server, by command kind
FALLBACKS: collections.Counter = collections.Counter()  # what went to `subprocess`, by reason
SERVERS_STARTED = [0]

_servers: dict = {}  # import-time environment -> _Server, least recently used first
_lock = threading.Lock()


def run(args, *, timeout=None, check=False, capture_output=False, input=None, **kwargs):
    """`subprocess.run`, through a fork server where it can be."""
    if input is not None:
        kwargs.pop("fresh_ranks", None)
        kwargs.pop("preload", None)
        args, kwargs = _hash_seeded(args, kwargs.pop("hash_seed", None), kwargs)
        FALLBACKS["input"] += 1
        return subprocess.run(args, timeout=timeout, check=check, capture_output=capture_output, input=input,
                              **kwargs)
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with Popen(args, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def Popen(args, *, fresh_ranks=False, preload="full", hash_seed=None, **kwargs):
    """`subprocess.Popen`, through a fork server where it can be (see the module docstring).
    The ranks of a torchrun command start through it too (forkserver_rank.py) unless
    `fresh_ranks` (for tests that measure a rank's memory) or `hash_seed` (a fresh interpreter
    with its own string-hash secret: see the module docstring). `preload` names what the server
    has imported (`PRELOADS`)."""
    if hash_seed is not None:
        args, kwargs = _hash_seeded(args, hash_seed, kwargs)
        if not _is_torchrun(args):  # its own secret: only a fresh interpreter has one
            FALLBACKS["hash_seed"] += 1
            return subprocess.Popen(args, **kwargs)
        fresh_ranks = True
    why = _why_fresh(args, kwargs)
    server = None if why else _get_server(os.environ if kwargs.get("env") is None else kwargs["env"], preload)
    if server is None:
        FALLBACKS[why or "no server"] += 1
        return subprocess.Popen(args, **kwargs)
    LAUNCHED[_kind(args)] += 1
    args = list(map(str, args))
    try:
        if _is_torchrun(args) and not fresh_ranks and preload == "full":
            args = _ranks_started_by(args, ["forkserver_rank.py", server.path])
        return _Forked(server, args, **kwargs)
    except BaseException:
        _release(server)  # the reservation _get_server made
        raise


def _is_torchrun(args) -> bool:
    return not isinstance(args, (str, bytes)) and list(map(str, args[1:3])) == ["-m", "torch.distributed.run"]


def _hash_seeded(args, hash_seed, kwargs) -> tuple:
    """(args, kwargs) for a command started with string-hash secret `hash_seed` (None: as they are):
    torchrun's ranks through hashseed_rank.py (PYTHONHASHSEED=hash_seed+RANK), any other command
    with PYTHONHASHSEED=hash_seed in its environment."""
    if hash_seed is None:
        return args, kwargs
    if _is_torchrun(args):
        ranks = _ranks_started_by(list(map(str, args)), ["hashseed_rank.py", str(int(hash_seed))])
        assert ranks != list(map(str, args)), f"hash_seed: torchrun's ranks cannot be wrapped in {args}"
        return ranks, kwargs
    env = os.environ if kwargs.get("env") is None else kwargs["env"]
    return args, {**kwargs, "env": {**env, "PYTHONHASHSEED": str(int(hash_seed))}}


def _ranks_started_by(args: list[str], stand_in: list[str]) -> list[str]:
    """`python -m torch.distributed.run OPTIONS [-m] TARGET ARGS` with each rank started as
    `python -I -S STAND_IN... -u [-m] TARGET ARGS` (the first of `stand_in` a script in this
    folder), where torchrun would run `python -u ...`."""
    from torch.distributed.run import get_args_parser

    parsed = get_args_parser().parse_args(args[3:])
    if parsed.no_python or parsed.run_path:
        return args
    at = len(args) - len(parsed.training_script_args) - 1
    assert args[at] == parsed.training_script, args
    options = [a for a in args[3:at] if a not in ("-m", "--module")]
    rank = [sys.executable, "-I", "-S", os.path.join(os.path.dirname(os.path.abspath(__file__)), stand_in[0]),
            *stand_in[1:], "-u", *(["-m"] if parsed.module else [])]
    return [*args[:3], *options, "--no-python", *rank, *args[at:]]


def _kind(args) -> str:
    a = list(map(str, args))
    if a[1] == "-m":
        return " ".join(a[2:4]) if a[2] == "easyvideor1.cli" else a[2]
    return "-c" if a[1] == "-c" else os.path.basename(a[1])


def _why_fresh(args, kwargs) -> str | None:
    if os.environ.get("EV1_TEST_FORKSERVER", "1") == "0":
        return "EV1_TEST_FORKSERVER=0"
    args = list(map(str, args)) if not isinstance(args, (str, bytes)) else None
    if not args or len(args) < 2 or args[0] != sys.executable:
        return "not the test interpreter"
    if args[1].startswith("-") and args[1] not in ("-m", "-c"):
        return f"interpreter option {args[1]}"
    if args[1] in ("-m", "-c") and len(args) < 3:
        return "no module or code"
    extra = set(kwargs) - POPEN_OPTIONS
    if extra:
        return f"option {sorted(extra)[0]}"
    if kwargs.get("stdin") not in (None, subprocess.DEVNULL):
        return "stdin"
    if kwargs.get("close_fds") is False or kwargs.get("bufsize", -1) not in (-1, 0, 1):
        return "close_fds/bufsize"
    return None


def _import_time_env(env) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items()
                        if not (k in CHILD_ENV_KEYS or k.startswith(CHILD_ENV_PREFIXES))))


class _Server:
    def __init__(self, env, preload="full"):
        self.folder = tempfile.mkdtemp(prefix="ev1-fork-")
        self.path = os.path.join(self.folder, "s")
        self.children = 0  # started and not yet reported
        self.proc = subprocess.Popen([sys.executable, __file__, self.path, preload], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # "ready" once the libraries are imported and the socket listens
        self.proc.stdout.close()
        if line.strip() != "ready":
            self.proc.wait()
            raise RuntimeError(f"fork server failed to start: {line!r}, exit {self.proc.returncode}")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for name, counter in (("ranks", LAUNCHED), ("fresh", FALLBACKS)):  # forkserver_rank.py's notes
            try:
                with open(f"{self.path}.{name}") as f:
                    counter.update(line.strip() for line in f)
            except FileNotFoundError:
                pass
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)


def _release(server) -> None:
    """One child of `server` reported or never started: under the lock, as `_get_server` reserves,
    so no count is lost between threads (a lost reservation would let a busy server close as idle)."""
    with _lock:
        server.children -= 1


def _get_server(env, preload="full") -> _Server | None:
    """The server for `env`'s import-time variables and `preload`, started if needed; None if none can be."""
    key = (preload, _import_time_env(env))
    with _lock:
        server = _servers.pop(key, None)
        if server is None:
            if sum(k[0] == preload for k in _servers) >= MAX_SERVERS:
                idle = next((k for k, s in _servers.items() if k[0] == preload and not s.children), None)
                if idle is None:
                    return None
                _servers.pop(idle).close()
            try:
                server = _Server(dict(env), preload)
            except (OSError, RuntimeError) as e:
                print(f"forkserver: {e}; this subprocess starts fresh", file=sys.stderr)
                return None
            SERVERS_STARTED[0] += 1
        _servers[key] = server  # most recently used last
        server.children += 1  # reserved under the lock: another thread must not close it as idle
        return server


def close_server() -> None:
    """Stop every server of this process (their running children are not touched)."""
    with _lock:
        while _servers:
            _servers.popitem()[1].close()


if __name__ != "__main__":  # the test process, not a server (whose children must not carry this)
    atexit.register(close_server)


class _Forked:
    """The part of `subprocess.Popen` the tests use, for a child of the fork server."""

    def __init__(self, server, args, stdout=None, stderr=None, stdin=None, env=None, cwd=None, text=None,
                 universal_newlines=None, encoding=None, errors=None, bufsize=-1, close_fds=True,
                 start_new_session=False):
        self.args = args
        self.returncode = None
        self.stdin = None
        text = bool(text or universal_newlines or encoding or errors)
        own, parent_ends = [], {}
        try:
            ends = [0]  # stdin: the caller's, or /dev/null
            if stdin == subprocess.DEVNULL:
                ends[0] = os.open(os.devnull, os.O_RDONLY)
                own.append(ends[0])
            for name, spec in (("stdout", stdout), ("stderr", stderr)):
                if spec is None:
                    ends.append(1 if name == "stdout" else 2)
                elif spec == subprocess.DEVNULL:
                    ends.append(os.open(os.devnull, os.O_WRONLY))
                    own.append(ends[-1])
                elif spec == subprocess.PIPE:
                    r, w = os.pipe()
                    parent_ends[name] = r
                    ends.append(w)
                    own.append(w)
                elif spec == subprocess.STDOUT and name == "stderr":
                    ends.append(ends[1])
                elif isinstance(spec, int):
                    ends.append(spec)
                else:
                    ends.append(spec.fileno())
            request = {"argv": args[1:], "env": dict(os.environ if env is None else env),
                       "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                       "new_session": bool(start_new_session)}
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.connect(server.path)
            body = json.dumps(request).encode()
            socket.send_fds(self._sock, [len(body).to_bytes(8, "little")], ends)
            self._sock.sendall(body)
            self._reply = self._sock.makefile("r")
            self.pid = json.loads(self._reply.readline())["pid"]
            self._server = server  # its `children` counts this one since _get_server (Popen)
        except BaseException:
            for fd in parent_ends.values():
                os.close(fd)
            raise
        finally:
            for fd in own:
                os.close(fd)
        for name in ("stdout", "stderr"):
            fd = parent_ends.get(name)
            f = None
            if fd is not None:
                f = io.open(fd, "r", encoding=encoding, errors=errors) if text else io.open(fd, "rb")
            setattr(self, name, f)

    def poll(self):
        if self.returncode is None:
            r, _, _ = select.select([self._sock], [], [], 0)
            if r:
                self._read_status()
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            r, _, _ = select.select([self._sock], [], [], timeout)
            if not r:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_status()
        return self.returncode

    def _read_status(self):
        line = self._reply.readline()
        if not line:
            _release(self._server)
            raise RuntimeError(f"fork server lost child {self.pid} of {self.args}")
        status = json.loads(line)
        self.returncode, self.cpu_s = status["returncode"], status["cpu_s"]  # cpu_s: the child's own CPU
        _release(self._server)
        self._reply.close()
        self._sock.close()

    def communicate(self, input=None, timeout=None):
        assert input is None, "input goes to subprocess (see run)"
        deadline = None if timeout is None else time.monotonic() + timeout
        streams = [f for f in (self.stdout, self.stderr) if f is not None]
        if not hasattr(self, "_chunks"):
            self._chunks = {id(f): [] for f in streams}
            self._readers = [threading.Thread(target=self._drain, args=(f,), daemon=True) for f in streams]
            for t in self._readers:
                t.start()
        for t in self._readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = [None, None]
        for i, f in enumerate((self.stdout, self.stderr)):
            if f is not None:
                out[i] = ("" if isinstance(f, io.TextIOBase) else b"").join(self._chunks[id(f)])
                f.close()
        return tuple(out)

    def _drain(self, f):
        chunks = self._chunks[id(f)]
        while True:
            piece = f.read(65536)
            if not piece:
                return
            chunks.append(piece)

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()


# ----------------------------------------------------------------------------------------------
# The server: `python forkserver.py SOCKET`. Imports PRELOAD, prints "ready", then forks one child
# per request and reports each child's exit status on the request's connection.


def _preload(names):
    for name in names:
        try:
            __import__(name)
        except Exception:  # an optional library (av, peft) missing: the child imports what it needs
            pass
    try:  # a Qwen processor's first load imports every video processor module transformers knows
        list(sys.modules["transformers.models.auto.video_processing_auto"].VIDEO_PROCESSOR_MAPPING.items())
    except Exception:
        pass


def _serve(path, preload):
    env = dict(os.environ)  # as started: imports may add to it (cv2 prepends to LD_LIBRARY_PATH)
    _preload(PRELOADS[preload])
    with open(path + ".json", "w") as f:  # for forkserver_rank.py, which imports nothing of this file
        json.dump({"env": env, "keys": sorted(CHILD_ENV_KEYS), "prefixes": CHILD_ENV_PREFIXES}, f)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    parent = os.getppid()
    print("ready", flush=True)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    waiting = {}  # pid -> connection
    bound = {}  # connection -> pid, for children that die with their caller (forkserver_rank.py)
    while True:
        readable, _, _ = select.select([listener, *bound], [], [], 0.05)
        for conn in readable:
            if conn is not listener:  # only a closed connection is readable: the rank's stand-in is gone
                os.kill(bound.pop(conn), signal.SIGKILL)  # so is the rank
        if listener in readable:
            conn, _ = listener.accept()
            head, fds, _, _ = socket.recv_fds(conn, 8, 3)
            size = int.from_bytes(head, "little")
            body = b""
            while len(body) < size:
                body += conn.recv(size - len(body))
            pid = os.fork()
            if pid == 0:
                listener.close()
                for c in waiting.values():
                    c.close()
                conn.close()
                return json.loads(body), fds
            for fd in fds:
                os.close(fd)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = conn
            if json.loads(body).get("bound"):
                bound[conn] = pid
        while waiting:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            bound.pop(conn, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                                             "cpu_s": usage.ru_utime + usage.ru_stime}).encode() + b"\n")
                except OSError:
                    pass  # the caller is gone
                conn.close()
        if os.getppid() != parent:  # the pytest worker died: its children are on their own
            os._exit(0)


def _become(request, fds):
    """Turn this fork into the requested command's process."""
    seen = set()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2 and fd not in seen:
            seen.add(fd)
            os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if request["new_session"]:
        os.setsid()
    if request.get("unbuffered"):  # python -u, as torchrun starts its ranks
        for name in ("stdout", "stderr"):
            old = getattr(sys, name)
            new = io.TextIOWrapper(io.FileIO(old.fileno(), "w", closefd=False), encoding=old.encoding,
                                   errors=old.errors, write_through=True)
            setattr(sys, name, new)
            setattr(sys, f"__{name}__", new)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    pythonpath = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]
    sys.path[1:] = list(dict.fromkeys(pythonpath + rest))
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    argv = request["argv"]
    sys.orig_argv = [sys.executable, *(["-u"] if request.get("unbuffered") else []), *argv]
    sys.modules["_ev1_forkserver"] = sys.modules["__main__"]  # keeps this module's globals alive

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(argv[1])
    elif argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    _SERVER_PYTHONPATH = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    _become(*_serve(sys.argv[1], sys.argv[2]))
