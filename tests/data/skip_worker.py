"""Train from `section.key=value` overrides until the run ends or stops on skipped samples; each
rank writes where it stopped, then leaves the process group (`distributed.close`, a collective:
ranks that decided differently would not meet there). A test helper, run as a script (torchrun):

    skip_worker.py OUT_PREFIX OVERRIDE...
"""

import json
import sys
from pathlib import Path

from easyvideor1 import distributed
from easyvideor1.config import load_config
from easyvideor1.training.setup import build_run
from easyvideor1.training.skips import TooManySkipped
from easyvideor1.training.trainer import train


def main(out: str, overrides: list[str]) -> None:
    run = build_run(load_config(None, overrides))
    stopped = None
    try:
        train(run)
    except TooManySkipped as e:
        stopped = str(e)
    Path(f"{out}-rank{run.rank}.json").write_text(json.dumps({"step": run.step, "logged": len(run.history),
                                                               "stopped": stopped}))
    distributed.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
