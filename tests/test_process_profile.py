"""scripts/process_profile.py on a real pytest run: the processes a test starts are counted under
their kind and their test file, and pytest's exit code comes back."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_counts_the_processes_a_test_starts(tmp_path):
    log = tmp_path / "processes.jsonl"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "process_profile.py"), "--log", str(log), "-q",
                        "-p", "no:cacheprovider", "tests/data/test_check_data.py::test_cli_exit_status"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)  # ends a hang only
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1 passed" in p.stdout and "[process_profile] pytest exit code 0" in p.stdout
    kinds = p.stdout.split("CPU by kind of process")[1].split("CPU of started processes by test file")
    # the test runs `easyvideor1 check-data` twice (a good file, a bad one); pytest itself is logged too
    row = next(line.split() for line in kinds[0].splitlines() if line.endswith("easyvideor1 check-data"))
    assert row[2] == "2" and float(row[0]) > 0
    assert any(line.endswith("pytest") for line in kinds[0].splitlines())
    assert any(line.split()[-1] == "tests/data/test_check_data.py" and line.split()[2] == "2"
               for line in kinds[1].splitlines() if line.strip())
    assert len(log.read_text().splitlines()) >= 3


def test_a_failing_run_keeps_its_exit_code(tmp_path):
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert False\n")
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "process_profile.py"), "-q", "-p", "no:cacheprovider",
                        str(tmp_path / "test_fails.py")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1 and "[process_profile] pytest exit code 1" in p.stdout
