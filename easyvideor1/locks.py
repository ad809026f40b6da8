"""Folder locks: one writer at a time for a results folder, a short critical section for a cache.

`FolderLock(folder, "eval")` holds an exclusive `fcntl.flock` on `<folder>/.eval.lock` for as
long as the context is open. The kernel drops the lock when its process dies (SIGKILL, OOM
killer, node reboot), so a killed run never leaves a lock that must be removed by hand; the
file itself stays and is reused. The holder writes its pid, host and start time into the file,
which the refusal message quotes. On NFS, Linux implements `flock` with the server's byte-range
locks, so the lock holds across nodes sharing the folder (with a lock manager running).

    with FolderLock(out_dir, "eval", wait=False):   # a second evaluation is refused (FolderBusy)
        ...
    with FolderLock(cache_dir, "cache"):             # a second builder waits its turn
        ...
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from easyvideor1.errors import UserError


class FolderBusy(UserError, RuntimeError):
    """Another live process holds the folder's lock."""


class FolderLock:
    def __init__(self, folder: str | os.PathLike, purpose: str, wait: bool = True, hint: str = ""):
        self.path = Path(folder) / f".{purpose}.lock"
        self.purpose, self.wait, self.hint = purpose, wait, hint
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise FolderBusy(f"{self.path.parent} is in use by another {self.purpose} ({holder}); "
                             f"wait for it to finish{self.hint}") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (ValueError, KeyError, OSError):
        return "holder unknown"
