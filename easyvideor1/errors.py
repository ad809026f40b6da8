"""`UserError`: bad input or settings, as opposed to a bug.

Its message names the sample, file or setting and says what to do; the command line prints it
as one paragraph and exits with status 2, without a traceback (`cli.main`). Library callers
catch it like any exception (each subclass is also a ValueError or RuntimeError).
"""

import errno


class UserError(Exception):
    """Bad input or settings; the message says what to do."""


class OutOfSpace(UserError, OSError):
    """A write failed because its filesystem is full (or the user's quota is spent)."""


_FULL = ("No space left on device", "Disk quota exceeded", "StorageFull", "QuotaExceeded", "code: 28,", "code: 122,")


def out_of_space(error: BaseException, path: object, what: str) -> OutOfSpace | None:
    """`OutOfSpace` naming `path` when `error` says the disk is full (an OSError with ENOSPC or
    EDQUOT, or a safetensors error wrapping one), else None. `what`: what to do after freeing
    space, e.g. "re-run: finished entries are kept"."""
    full = (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
        s in str(error) for s in _FULL)
    if not full:
        return None
    return OutOfSpace(f"no space left on the device writing {path}; free space there (or choose another "
                      f"output folder), then {what}")
