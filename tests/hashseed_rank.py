"""A torchrun rank in a fresh interpreter with a string-hash secret of its own (forkserver's `hash_seed`).

torchrun gives all its ranks one environment, and a forked rank keeps its parent's secret; a
user's ranks each draw their own. torchrun runs this (`--no-python`) as
`python -I -S hashseed_rank.py BASE -u [-m] TARGET ...` where it would have run
`python -u [-m] TARGET ...`; it sets PYTHONHASHSEED=BASE+RANK and becomes that command
(`os.execv`: same pid, so torchrun's signals reach the rank) before anything else is imported.
Standard library only, no site.
"""

import os
import sys


def main():
    base, argv = int(sys.argv[1]), sys.argv[2:]
    os.environ["PYTHONHASHSEED"] = str(base + int(os.environ["RANK"]))
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main()
