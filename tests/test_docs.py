"""The documentation site builds, its generated pages are current, and every command it shows parses.

Nothing here runs a command: the parsers are real (argparse of `easyvideor1`, torchrun's, the
config tree, the Makefile), so a removed flag or config key fails the suite, not the reader.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

import docs_commands
from docs_commands import ROOT, CommandLine


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _all_commands() -> list[CommandLine]:
    commands = []
    for path in docs_commands.doc_files():
        commands += docs_commands.shell_lines(path.read_text(), str(path.relative_to(ROOT)))
    for script in sorted((ROOT / "scripts" / "slurm").glob("*")):
        commands += docs_commands.script_lines(script)
    return [c for c in commands if docs_commands.is_checked(c)]


def test_generated_reference_pages_are_current():
    gen = _gen_docs()
    stale = gen.stale_pages()
    assert not stale, f"{', '.join(stale)} out of date: run {gen.COMMAND}"


def test_every_command_line_shown_parses():
    commands = _all_commands()
    assert len(commands) > 40, "the command-line collector found too few commands; is it broken?"
    problems = [p for p in (docs_commands.check(c) for c in commands) if p]
    assert not problems, "command lines in the docs that the real parsers refuse:\n" + "\n".join(problems)


@pytest.mark.parametrize("line, problem", [
    ("easyvideor1 demo --minutes 20", "unrecognized arguments: --minutes"),
    ("easyvideor1 train configs/demo_cpu.yaml training.stepz=3", "unknown config key training.stepz"),
    ("easyvideor1 demo --steps 20 rollout.m=2", "unknown config key rollout.m"),
    ("easyvideor1 train configs/nope.yaml", "no config file configs/nope.yaml"),
    ("torchrun --nproc-per-node 8 -m easyvideor1.cli train CONFIG model.lora.rnk=8", "unknown config key"),
    ("torchrun --gpus 8 -m easyvideor1.cli train CONFIG", "unrecognized arguments: --gpus"),
    ("easyvideor1 demo --step 3", "unrecognized arguments: --step"),  # no abbreviations: argparse would take --steps
    ("easyvideor1 eval --model M --benchmarks videomme,nosuchbench", "unknown benchmark 'nosuchbench'"),
    ("easyvideor1 eval --model M --benchmarks videomme --preset nope", "invalid choice: 'nope'"),
    ("make demo && make nosuchtarget", "no Makefile target nosuchtarget"),
    ("bash scripts/nosuch.sh", "no file scripts/nosuch.sh"),
])
def test_the_checks_refuse_what_the_parsers_refuse(line, problem):
    found = docs_commands.check(CommandLine("page.md:1", line))
    assert found and problem in found, found


def test_the_collector_reads_shell_blocks_only_and_joins_continuations():
    page = ("```bash\neasyvideor1 demo \\\n  --steps 3   # a comment\nmake test\n```\n"
            "```text\neasyvideor1 [-h] COMMAND ...\n```\n")
    lines = docs_commands.shell_lines(page, "page.md")
    assert [(c.source, c.text) for c in lines] == [("page.md:2", "easyvideor1 demo --steps 3   # a comment"),
                                                    ("page.md:4", "make test")]
    assert all(docs_commands.check(c) is None for c in lines)


def test_readme_stays_one_screen_of_orientation():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150, "README.md: move detail into docs/"


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material 9.8 prints a banner about its successor
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
