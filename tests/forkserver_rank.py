"""A torchrun rank, started by the fork server of tests/forkserver.py.

torchrun runs it (`--no-python`) as `python -I -S forkserver_rank.py SOCKET -u [-m] TARGET ...`,
where it would have run `python -u [-m] TARGET ...`. Standard library only, no site: it starts in
~20 ms. It asks the server to fork a child that becomes `python -u [-m] TARGET ...` with this
process's stdin/stdout/stderr, environment and folder, passes on every signal torchrun sends
(torchrun signals its ranks' process groups), and exits as the child did: the same code, or the
same signal. If the server cannot give the child what a fresh interpreter would (an environment
variable read when torch is imported differs), or is gone, it becomes the fresh interpreter
(`os.execv`). The child dies with this process: the server kills it when this connection closes.
"""

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _note(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def main():
    path, argv = sys.argv[1], sys.argv[2:]
    why = None
    try:
        with open(path + ".json") as f:
            server = json.load(f)
    except OSError:
        server, why = None, "rank: no server"
    if server is not None:
        for key in set(os.environ) ^ set(server["env"]) | {k for k in os.environ if os.environ[k] != server["env"].get(k)}:
            if key not in server["keys"] and not key.startswith(tuple(server["prefixes"])):
                why = f"rank: environment {key}"
                break
    if why is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            why = "rank: no server"
    if why is not None:
        _note(path + ".fresh", why)
        os.execv(sys.executable, [sys.executable, *argv])
    unbuffered = argv[0] == "-u"
    request = {"argv": argv[1:] if unbuffered else argv, "env": dict(os.environ), "cwd": os.getcwd(),
               "new_session": False, "unbuffered": unbuffered, "bound": True}
    body = json.dumps(request).encode()
    socket.send_fds(sock, [len(body).to_bytes(8, "little")], [0, 1, 2])
    sock.sendall(body)
    reply = sock.makefile("r")
    pid = json.loads(reply.readline())["pid"]
    _note(path + ".ranks", "rank")
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    line = reply.readline()
    code = json.loads(line)["returncode"] if line else 1
    if code < 0:  # end as the child ended
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF if code >= 0 else 1)


if __name__ == "__main__":
    main()
