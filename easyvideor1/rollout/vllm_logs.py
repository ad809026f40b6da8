"""vLLM's output sent to a file (`VLLMOutput(path)`), so a console shows only ours.

vLLM writes from this process (its `vllm.*` loggers, and the root logger for what it logs
while importing) and from the processes it starts: the engine core, its workers and the
multiprocessing resource tracker, which prints `leaked shared_memory objects` when the
program ends. Those processes write to the stdout/stderr they inherited when started, so:

- `starting()` wraps vLLM's import and the engine's construction: fds 1 and 2 point at the file
  (appended) for that block only, so every process started in it writes there for its whole life
  (logging, print, tqdm, C++ warnings), and so does this process's output in the block where
  sys.stdout / sys.stderr write to fds 1 / 2 (a command; not under pytest's capture or in a
  notebook, whose streams are left alone); then the fds are restored;
- the `vllm` logger of this process writes to the file (vLLM's formatter), not propagating, from
  the block on: requests, warnings and shutdown lines (`force killing ...`);
- `release()` (at the engine's close, after its shutdown) gives the `vllm` logger back its handlers.

Our own output in the block (other threads included) lands in the file too; after it, ours
(print, tqdm, `easyvideor1.*` loggers) reaches the console as before. A resource tracker
already running before the block keeps the stderr it was started with. `None` changes nothing.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path


class VLLMOutput:
    """Where vLLM's output goes: vLLM's defaults (`log_file` None) or the file `log_file`."""

    def __init__(self, log_file: str | os.PathLike | None):
        self.path = None if log_file is None else Path(log_file)
        self._handler: logging.FileHandler | None = None
        self._saved: tuple[list[logging.Handler], bool] | None = None  # the vllm logger's own

    @contextmanager
    def starting(self):
        """Inside: fds 1/2 on the file (processes started here inherit them); after it, the
        `vllm` logger on the file. An error raised inside names the file."""
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _flush()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            self._to_file()  # what vLLM logs before it configures its logger (while importing)
            yield
        except Exception as e:
            e.add_note(f"vLLM's log: {self.path}")
            raise
        finally:
            _flush()  # what Python buffered in the block goes to the file, not after it
            for target, copy in zip((1, 2), saved):
                os.dup2(copy, target)
                os.close(copy)
            os.close(fd)
            self._to_file()

    def _to_file(self) -> None:
        # Building an engine (re)configures vLLM's logger with a stream handler on sys.stdout
        # (vllm.logger, dictConfig), so the file handler goes in again after each block.
        log = logging.getLogger("vllm")
        if self._handler is None:
            self._handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        if self._handler in log.handlers:
            return
        theirs = next((h.formatter for h in log.handlers if h.formatter is not None), None)
        self._handler.setFormatter(theirs or logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self._saved = (list(log.handlers), log.propagate)  # vLLM's latest configuration
        log.handlers = [self._handler]
        log.propagate = False

    def release(self) -> None:
        """The `vllm` logger as vLLM last configured it; the file closed."""
        if self._saved is not None:
            log = logging.getLogger("vllm")
            log.handlers, log.propagate = self._saved
            self._saved = None
        if self._handler is not None:
            self._handler.close()
            self._handler = None


def _flush() -> None:
    """sys.stdout and sys.stderr flushed; one closed by the code in the block is skipped."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
