"""The documentation site builds, its generated pages are current, and every command it shows parses.

Nothing here runs a command: the parsers are real (argparse of `easyvideor1`, torchrun's, the
config tree, the Makefile), so a removed flag or config key fails the suite, not the reader.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _mkdocs_strict_build(config: Path, site: Path) -> list[str]:
    """The problems `mkdocs build --strict` reports: its WARNING and ERROR lines and a non-zero exit.

    Not --quiet: mkdocs 1.6 then drops warnings before its strict counter sees them, and a build
    with broken links exits 0 while `mkdocs serve` (mkdocs.yml sets strict: true) aborts on them.
    """
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material 9.8 prints a banner about its successor
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, cwd=config.parent, env=env)
    output = _ANSI.sub("", proc.stdout + proc.stderr)
    problems = [line for line in output.splitlines() if line.lstrip().startswith(("WARNING", "ERROR"))]
    if proc.returncode != 0:
        problems.append(f"exit status {proc.returncode}; output ends:\n{output[-2000:]}")
    return problems


def test_mkdocs_build_strict(tmp_path):
    problems = _mkdocs_strict_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert not problems, "\n".join(problems)
    assert (tmp_path / "site" / "index.html").is_file()
    # The changelog's GitHub-style `docs/...` links become site links (docs/hooks/changelog_links.py).
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert 'href="../guides/evaluation/#confidence-intervals-and-comparing-checkpoints"' in changelog
    assert 'href="docs/' not in changelog


def test_mkdocs_build_strict_fails_on_a_planted_broken_link(tmp_path):
    """The check above can fail: a copy of the docs with a missing page and a missing anchor."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")  # changelog.md: a copy of CHANGELOG.md, not a link
    changelog = tmp_path / "docs" / "changelog.md"
    assert not changelog.is_symlink()
    changelog.write_text(changelog.read_text() + "\n- Planted: [gone](docs/guides/no-such-page.md).\n")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\nPlanted: [a section](getting-started.md#no-such-section).\n")
    problems = _mkdocs_strict_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    warnings = [p for p in problems if p.startswith("WARNING")]
    assert any("'guides/no-such-page.md'" in w and "changelog.md" in w for w in warnings), problems
    assert any("#no-such-section" in w and "index.md" in w for w in warnings), problems
    assert len(warnings) == 2, problems
    assert problems[-1].startswith("exit status 1"), problems


def test_a_figure_edited_by_hand_is_stale(tmp_path):
    """The demo's time stands in README.md and docs/demo.md as generated from docs/measured/demo.json:
    a page whose figure differs from the source (edited by hand, or the source changed) is stale."""
    gen = _gen_docs()
    for rel in (*gen.FRAGMENT_PAGES, gen.MEASURED_DEMO, *gen.PAGES):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    assert gen.stale_pages(tmp_path) == []
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("<!-- gen:demo-time -->**", "<!-- gen:demo-time -->**1", 1))
    assert gen.stale_pages(tmp_path) == ["README.md"]
    source = json.loads((tmp_path / gen.MEASURED_DEMO).read_text())
    (tmp_path / gen.MEASURED_DEMO).write_text(json.dumps({**source, "minutes": source["minutes"] + 1}))
    assert gen.stale_pages(tmp_path) == list(gen.FRAGMENT_PAGES)


def test_data_format_tables_follow_the_registries(tmp_path):
    """docs/reference/data-format.md's tables are generated from the reward registry and the loader's
    aliases: a family registered with a form shows up with its aliases and example, one without a
    form shows up as undescribed, and a table edited by hand is stale."""
    from easyvideor1.rewards import ALIASES, ANSWER_FORMS, TASK_FAMILIES, AnswerForm, Verdict, register

    gen = _gen_docs()
    page = "docs/reference/data-format.md"
    assert page in gen.TABLE_PAGES
    example = {"problem": "What colour?", "answer": "red", "problem_type": "colour name"}
    register("colour name", lambda r, s, c: Verdict(1.0, True), aliases=("colour",),
             form=AnswerForm("a colour word: `red`", "exact", example))
    register("undescribed", lambda r, s, c: Verdict(1.0, True))
    try:
        forms, examples = gen.answer_forms(), gen.example_records()
    finally:
        for name in ("colour name", "undescribed"):
            TASK_FAMILIES.pop(name)
            ANSWER_FORMS.pop(name, None)
        ALIASES.pop("colour")
    assert "| `colour name` | `colour` | a colour word: `red` | exact |" in forms
    assert "| `undescribed` |  | (not described: give `register` a `form`) |" in forms
    assert f"| `colour name` | `` {json.dumps(example)} `` |" in examples
    for rel in (*gen.FRAGMENT_PAGES, gen.MEASURED_DEMO, *gen.PAGES, page):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    assert gen.stale_pages(tmp_path) == []
    copy = tmp_path / page
    copy.write_text(copy.read_text().replace("| `mc`, `multiple-choice` |", "| `mc` |", 1))
    assert gen.stale_pages(tmp_path) == [page]
