"""Run `easyvideor1 train CONFIG [overrides]` while recording every folder `tempfile.mkdtemp`
makes (Python's `tempfile.mkdtemp` audit event), written to `<out_dir>/temp-dirs.json`: a folder
removed again before the process ends still shows. A test helper, run as a script."""

import json
import os
import sys

FOLDERS: list[str] = []


def _record(event: str, args: tuple) -> None:
    if event == "tempfile.mkdtemp":
        FOLDERS.append(str(args[0]))


if __name__ == "__main__":  # (vLLM's spawned processes import this file too: record only here)
    sys.addaudithook(_record)
    from easyvideor1.cli import main
    from easyvideor1.config import load_config

    code = main(["train", *sys.argv[1:]])
    out = load_config(sys.argv[1], sys.argv[2:]).logging.out_dir
    with open(os.path.join(out, "temp-dirs.json"), "w") as f:
        json.dump(FOLDERS, f)
    sys.exit(code)
