"""`UserError`: bad input or settings, as opposed to a bug.

Its message names the sample, file or setting and says what to do; the command line prints it
as one paragraph and exits with status 2, without a traceback (`cli.main`). Library callers
catch it like any exception (each subclass is also a ValueError or RuntimeError).
"""


class UserError(Exception):
    """Bad input or settings; the message says what to do."""
