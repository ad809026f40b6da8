"""Every command line the README and the docs show, checked against the real parsers without running.

A command line is a line of a ```bash / ```sh / ```console / ``` block (continuations joined,
comments dropped, `&&` / `;` / `|` split) that runs `easyvideor1`, `python -m easyvideor1.cli`,
`torchrun ... -m easyvideor1.cli`, `make` or a script of the repository. Checks:

- `easyvideor1 ...`: `cli.build_parser().parse_args` (unknown or removed flags, bad choices and
  types fail); for `train`, `export` and `demo` the config file must exist and every
  `section.key=value` override is loaded onto it (`load_config`: unknown keys fail); for `eval`,
  every `--benchmarks` name must be registered (or be a sample-file path).
- `torchrun ...`: torch's own launcher parser, then the `easyvideor1.cli` part as above.
- `make TARGET`: a target of the Makefile. `bash|python FILE`: the file exists.

`$VAR` and `${VAR}` stand for values the reader supplies and are read as `0`; all-caps words
(`CONFIG`, `MODEL_DIR`) are placeholders where a config file or path goes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass
class CommandLine:
    source: str
    """`path:line` of the command's first line."""
    text: str
    """The command as the reader sees it (continuations joined)."""


def doc_files(root: Path = ROOT) -> list[Path]:
    """The README and every Markdown page of the docs site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def shell_lines(text: str, source: str) -> list[CommandLine]:
    """The lines of shell code blocks in Markdown `text`, continuations joined."""
    out, in_block, lang, pending, start = [], False, "", "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```+\s*([\w-]*)", line)
        if fence:
            in_block, lang = (not in_block, fence.group(1).lower()) if not in_block else (False, "")
            continue
        if not in_block or lang not in SHELL_BLOCKS:
            continue
        line = re.sub(r"^\s*\$ ", "", line)
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].strip() + " "
            continue
        out.append(CommandLine(f"{source}:{start}", (pending + line.strip()).strip()))
        pending = ""
    return [c for c in out if c.text and not c.text.startswith("#")]


def script_lines(path: Path, root: Path = ROOT) -> list[CommandLine]:
    """A shell script shipped as a recipe (e.g. the Slurm script), as one block."""
    return shell_lines("```bash\n" + path.read_text() + "\n```", str(path.relative_to(root)))


def _words(text: str) -> list[list[str]]:
    text = re.sub(r'"?\$[@*]"?', "", text)  # a script's own arguments: none here
    text = re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "0", text)
    words = shlex.split(text, comments=True)
    commands, current = [], []
    for w in words:
        if w in SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(w)
    return [c for c in commands + [current] if c]


def _strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """No abbreviated flags (argparse takes `--step` for `--steps`): a page must spell a flag out,
    so renaming or removing it fails here."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub)
    return parser


@functools.cache
def _easyvideor1_parser() -> argparse.ArgumentParser:
    from easyvideor1 import cli

    return _strict(cli.build_parser())


def _parse_argparse(parser, argv: list[str]):
    """parse_args, with argparse's error message returned instead of exiting."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):  # --help prints
        try:
            return parser.parse_args(argv), None
        except SystemExit as e:
            if e.code in (0, None):
                return None, None  # --help
            lines = err.getvalue().strip().splitlines()
            return None, lines[-1] if lines else f"exit {e.code}"


def _config_file(arg: str | None, root: Path) -> tuple[str | None, str | None]:
    """(config path or None, problem): a placeholder word stands for any config."""
    if arg is None or PLACEHOLDER.match(arg) or arg == "0":
        return None, None
    path = root / arg
    return (str(path), None) if path.is_file() else (None, f"no config file {arg}")


def check_easyvideor1(argv: list[str], root: Path = ROOT) -> str | None:
    """None when `easyvideor1 argv...` parses and its config overrides load; else the problem."""
    from easyvideor1 import config_tree
    from easyvideor1.config import load_config

    args, error = _parse_argparse(_easyvideor1_parser(), argv)
    if error or args is None:
        return error
    try:
        if args.command in ("train", "export"):
            first = args.config
            overrides = list(args.overrides)
            if args.command == "export" and first and "=" not in first and not first.endswith((".yaml", ".yml")):
                first = None  # a checkpoint or run folder: the config it recorded (made by a command before)
            if first and "=" in first and not (root / first).is_file():
                first, overrides = None, [first, *overrides]
            path, problem = _config_file(first, root)
            if problem:
                return problem
            load_config(path, overrides)
        elif args.command == "demo":  # its overrides go onto the packaged demo config (training.demo.demo_config_path,
            load_config(str(root / "easyvideor1" / "configs" / "demo_cpu.yaml"), list(args.overrides))  # which imports transformers)
        elif args.command == "eval":
            from easyvideor1.evaluation.adapters import get_benchmark
            for name in args.benchmarks.split(","):
                if not PLACEHOLDER.match(name):
                    get_benchmark(name)
    except (config_tree.ConfigError, ValueError) as e:
        return str(e)
    return None


def _makefile_targets(root: Path) -> set[str]:
    return set(re.findall(r"^([\w.-]+):", (root / "Makefile").read_text(), flags=re.M))


def check_words(words: list[str], root: Path = ROOT) -> str | None:
    """None when one simple command is fine (or not ours to check); else the problem."""
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value prefixes
        words = words[1:]
    if words and words[0] in ("srun", "sudo", "time", "timeout"):  # launchers: their options, then the command
        words = words[2:] if words[0] == "timeout" else words[1:]
        while words and words[0].startswith("-"):
            words = words[1:]
    if not words:
        return None
    head = Path(words[0]).name
    if head == "easyvideor1":
        return check_easyvideor1(words[1:], root)
    if head.startswith("python") and words[1:3] == ["-m", "easyvideor1.cli"]:
        return check_easyvideor1(words[3:], root)
    if head == "torchrun":
        from torch.distributed.run import get_args_parser

        args, error = _parse_argparse(_strict(get_args_parser()), words[1:])
        if error:
            return f"torchrun: {error}"
        if not args.module or args.training_script != "easyvideor1.cli":
            return "torchrun: run the package as `-m easyvideor1.cli`"
        return check_easyvideor1(list(args.training_script_args), root)
    if head == "make":
        missing = [t for t in words[1:] if not t.startswith("-") and t not in _makefile_targets(root)]
        return f"no Makefile target {missing[0]}" if missing else None
    if head in ("bash", "sh") or head.startswith("python"):
        script = next((w for w in words[1:] if not w.startswith("-")), None)
        if script and "/" in script and not (root / script).exists():
            return f"no file {script}"
    return None


def check(command: CommandLine, root: Path = ROOT) -> str | None:
    """None when every simple command of the line passes; else `source: command: problem`."""
    try:
        simple = _words(command.text)
    except ValueError as e:
        return f"{command.source}: {command.text}: cannot split: {e}"
    for words in simple:
        problem = check_words(words, root)
        if problem:
            return f"{command.source}: {command.text}: {problem}"
    return None


def is_checked(command: CommandLine) -> bool:
    """True when the line runs something these checks understand."""
    try:
        simple = _words(command.text)
    except ValueError:
        return True
    names = {Path(w).name for words in simple for w in words[:3]}
    return bool(names & {"easyvideor1", "torchrun", "make"}) or "easyvideor1.cli" in command.text
