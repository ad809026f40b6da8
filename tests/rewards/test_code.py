"""Code families: Python against reference tests in the sandbox, SVG and HTML by rendering."""

import shutil
import tempfile
from pathlib import Path

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import RewardConfig, score
from easyvideor1.rewards.html_code import find_chromium
from easyvideor1.rewards.sandbox import run_python

ADD_TESTS = [
    "assert add(1, 2) == 3",
    "assert add(-1, 1) == 0",
    "assert add(10, 5) == 15",
    "assert add(0, 0) == 0",
]
REFERENCE = "<answer>\n```python\ndef add(a, b):\n    return a + b\n```\n</answer>"
# Short enough that the endless loop below is cheap, far above the ~0.1-0.3 s a real run takes
# (sandbox start included) even with the cores busy.
FAST = RewardConfig(code_timeout_s=5)


def code_sample(tests=ADD_TESTS, **extra):
    return Sample(
        problem="Write add(a, b).",
        answer=REFERENCE,
        problem_type="code",
        problem_id="c-1",
        extra={"tests": tests, **extra},
    )


def wrap(code):
    return f"<think>Simple.</think><answer>\n```python\n{code}\n```\n</answer>"


@pytest.mark.parametrize(
    "code, accuracy",
    [
        ("def add(a, b):\n    return a + b", 1.0),
        ("add = lambda a, b: a + b", 1.0),
        ("def add(a, b):\n    return a - b", 0.25),  # only add(0, 0) == 0 holds
        ("def add(a, b):\n    return 3", 0.25),  # only add(1, 2) == 3 holds
        ("def add(a, b):\n    return abs(a) + b", 0.75),  # fails add(-1, 1)
        ("def add(a, b):\n    raise NotImplementedError", 0.0),
        ("def add(a, b) return a + b", 0.0),  # syntax error: never run
        ("import sys\nsys.exit(0)", 0.0),  # exiting early passes nothing
        ("import os\nprint('PASS 0', flush=True)\nos._exit(0)", 0.0),  # forged output is ignored
        ("import socket\ndef add(a, b):\n    return a + b", 0.0),  # network refused at import
        ("def add(a, b):\n    while True:\n        pass", 0.0),  # killed at the time limit
    ],
)
def test_python_cases(code, accuracy):
    assert score(wrap(code), code_sample(), FAST).accuracy == pytest.approx(accuracy)


def test_python_format_and_reference_scores_one():
    sample = code_sample()
    assert score(REFERENCE, sample).accuracy == 1.0
    assert score(wrap("def add(a, b):\n    return a + b"), sample).format == 1.0
    assert score(wrap("def add(a, b) return"), sample).format == 0.5


def test_humaneval_and_mbpp_test_forms():
    humaneval = code_sample(
        tests=None,
        test="def check(candidate):\n    assert candidate(2, 3) == 5\n",
        entry_point="add",
    )
    humaneval.extra.pop("tests")
    assert score(wrap("def add(a, b):\n    return a + b"), humaneval).accuracy == 1.0
    mbpp = Sample(
        problem="p",
        answer=REFERENCE,
        problem_type="code",
        extra={"test_list": ["assert add(1, 1) == two"], "test_setup_code": "two = 2"},
    )
    assert score(wrap("def add(a, b):\n    return a + b"), mbpp).accuracy == 1.0


def test_missing_tests_is_an_error_naming_the_sample():
    with pytest.raises(ValueError, match="c-1"):
        score(wrap("pass"), Sample(problem="p", answer="x", problem_type="code", problem_id="c-1"))


def test_sandbox_limits():
    # timed_out says the wall-clock kill ended the loop (no clock read here: load cannot fail it);
    # 3 s leaves "assert 1" ample time to report first on a busy machine.
    run = run_python("def f():\n    while True: pass", ["assert 1", "f()", "assert 2"], timeout_s=3)
    assert run.timed_out and run.passed == [True, False, False]  # results before the hang survive
    assert (
        run_python("x = bytearray(4 * 1024**3)", ["pass"], memory_mb=256).setup_error
        == "MemoryError"
    )
    assert (
        run_python("open('/tmp/ev1-sandbox-escape', 'w')", ["pass"]).setup_error
        == "PermissionError"
    )
    assert run_python("import subprocess", ["pass"]).setup_error == "PermissionError"
    assert run_python("import os\nos.system('true')", ["pass"]).setup_error == "PermissionError"
    assert (
        run_python("import urllib.request", ["pass"]).setup_error == "PermissionError"
    )  # pulls in socket
    assert run_python("import sys\nsys._getframe(0)", ["pass"]).setup_error == "PermissionError"
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]
    assert run_python("def add(a, b):\n    return a + b", tests) == run_python("def add(a, b):\n    return a + b", tests)
    wrote = run_python(
        "open('mine.txt', 'w').write('ok')", ["assert open('mine.txt').read() == 'ok'"]
    )
    assert wrote.passed == [True]  # its own throwaway directory is writable


SVG_REF = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100">'
           '<rect x="0" y="0" width="50" height="100" fill="#000"/></svg>')  # fmt: skip


def svg(body, view="0 0 100 100"):
    return f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="{view}">{body}</svg>'


def tagged(content):
    return "<think>Drawing it.</think><answer>" + content + "</answer>"


@pytest.mark.parametrize(
    "response, low, high",
    [
        (tagged(SVG_REF), 1.0, 1.0),
        (tagged(svg("<rect width='50' height='100' fill='black'/>")), 1.0, 1.0),
        (tagged(svg("<rect width='25' height='100' fill='#000'/>")), 0.45, 0.55),  # half the area
        (tagged(svg("")), 0.0, 0.0),  # blank canvas earns nothing
        (tagged(svg("<rect x='50' width='50' height='100' fill='#000'/>")), 0.0, 0.0),  # wrong half
        (
            tagged(svg("<rect width='50' height='100' fill='#808080'/>")),
            0.45,
            0.55,
        ),  # grey, not black
        (tagged("<svg><rect"), 0.0, 0.0),  # malformed
        (tagged("I cannot draw"), 0.0, 0.0),
        ("Here you go:\n```svg\n" + SVG_REF + "\n```", 1.0, 1.0),  # untagged, fenced
        (
            tagged(svg("<image href='http://example.com/x.png' width='50' height='100'/>")),
            0.0,
            0.0,
        ),  # nothing fetched
    ],
)
def test_svg_cases(response, low, high):
    sample = Sample(
        problem="Draw it.",
        answer=f"<answer>{SVG_REF}</answer>",
        problem_type="svg-code",
        problem_id="s-1",
    )
    assert low - 1e-6 <= score(response, sample).accuracy <= high + 1e-6


def test_svg_format_and_bad_reference():
    sample = Sample(problem="Draw it.", answer=SVG_REF, problem_type="svg-code", problem_id="s-1")
    assert score(f"<think>.</think><answer>{SVG_REF}</answer>", sample).format == 1.0
    assert score("<think>.</think><answer><svg><rect</answer>", sample).format == 0.5
    with pytest.raises(ValueError, match="s-2"):
        score(
            SVG_REF,
            Sample(problem="p", answer="not svg", problem_type="svg-code", problem_id="s-2"),
        )


needs_chromium = pytest.mark.skipif(
    find_chromium() is None, reason="Chromium not installed (apt-get install -y chromium)"
)
PAGE = '<!DOCTYPE html><html><body style="margin:0;background:#fff"><div style="width:320px;height:480px;background:#000"></div></body></html>'


def page(div_style):
    return f'<!DOCTYPE html><html><body style="margin:0;background:#fff"><div style="{div_style}"></div></body></html>'


@needs_chromium
@pytest.mark.parametrize(
    "response, low, high",
    [
        (tagged(PAGE), 1.0, 1.0),
        (tagged(page("width:50%;height:480px;background:black")), 1.0, 1.0),
        (tagged(page("width:160px;height:480px;background:#000")), 0.45, 0.55),  # half the area
        (tagged(page("width:0")), 0.0, 0.0),  # blank page earns nothing
        (
            tagged(page("margin-left:320px;width:320px;height:480px;background:#000")),
            0.0,
            0.0,
        ),  # wrong half
        ("```html\n" + PAGE + "\n```", 1.0, 1.0),  # untagged, fenced
        (tagged("no page here"), 0.0, 0.0),
        (
            tagged("<div style='width:320px;height:480px;background:#000'></div>"),
            0.85,
            1.0,
        ),  # fragment, 8px body margin
        (
            tagged(page("width:320px;height:480px;background:url(http://example.com/a.png),#000")),
            1.0,
            1.0,
        ),  # offline
        (
            tagged(
                "<html><body><script>document.body.style.background='#000'</script></body></html>"
            ),
            0.0,
            0.0,
        ),  # all black
    ],
)
def test_html_cases(response, low, high):
    sample = Sample(
        problem="Make it.",
        answer=f"<answer>{PAGE}</answer>",
        problem_type="html-code",
        problem_id="h-1",
    )
    assert low - 1e-6 <= score(response, sample).accuracy <= high + 1e-6


def test_html_without_chromium_is_a_clear_error():
    sample = Sample(problem="Make it.", answer=PAGE, problem_type="html-code", problem_id="h-1")
    with pytest.raises(RuntimeError, match="apt-get install -y chromium"):
        score(PAGE, sample, RewardConfig(chromium="/nonexistent/chromium"))


def test_html_reference_that_does_not_render_names_the_sample_and_why():
    """A reference page Chromium cannot render is the sample's error, with Chromium's exit code
    (a real executable that fails: /bin/false), after a second try; an answer with no HTML says so."""
    sample = Sample(problem="Make it.", answer=PAGE, problem_type="html-code", problem_id="h-2")
    with pytest.raises(ValueError, match=r"'h-2'.*Chromium exited with 1 and no screenshot"):
        score(PAGE, sample, RewardConfig(chromium="/bin/false"))
    empty = Sample(problem="Make it.", answer="plain words", problem_type="html-code", problem_id="h-3")
    with pytest.raises(ValueError, match=r"'h-3'.*no HTML in it"):
        score(PAGE, empty, RewardConfig(chromium="/bin/false"))


def test_html_reference_renders_once_per_process_and_a_failure_is_tried_again(tmp_path):
    """Every response of a sample is compared with one reference page: it is rendered once and
    reused (the property test scores 4,000 responses against one page; a launch each took over
    an hour). A reference that fails is not cached: each score tries it twice again. Counted with
    a real executable in front of Chromium that writes a line per launch."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium not installed")
    shared = Path(tempfile.mkdtemp(prefix="ev1-launches-"))  # the browser runs as nobody when we are root
    try:
        shared.chmod(0o777)
        log = shared / "launches"
        log.touch()
        log.chmod(0o666)
        wrappers = {}
        for name, target in (("works", f'exec {chromium} "$@"'), ("fails", "exit 1")):
            wrappers[name] = shared / name
            wrappers[name].write_text(f"#!/bin/sh\necho {name} >> {log}\n{target}\n")
            wrappers[name].chmod(0o755)
        launches = lambda: log.read_text().split()  # noqa: E731
        page = PAGE.replace("#000", "#123456")  # a reference no other test renders in this process
        sample = Sample(problem="Make it.", answer=page, problem_type="html-code", problem_id="h-4")
        works = RewardConfig(chromium=str(wrappers["works"]))
        responses = [page, PAGE, page.replace("320px", "160px")]
        first = [score(r, sample, works).accuracy for r in responses]
        assert launches() == ["works"] * 4  # the reference once, each distinct response once
        assert [score(r, sample, works).accuracy for r in responses] == first and len(launches()) == 4
        assert first[0] == pytest.approx(1.0) and first[1] < 1.0

        failing = Sample(problem="Make it.", answer=page.replace("#123456", "#654321"), problem_type="html-code",
                         problem_id="h-5")
        for tries in (2, 4):
            with pytest.raises(ValueError, match=r"'h-5'.*Chromium exited with 1"):
                score(page, failing, RewardConfig(chromium=str(wrappers["fails"])))
            assert launches().count("fails") == tries
    finally:
        shutil.rmtree(shared, ignore_errors=True)
