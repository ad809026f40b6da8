"""HTML code: screenshot the response's page and the reference in headless Chromium, compare.

Needs Debian's `chromium` (`apt-get install -y chromium`); without it scoring raises a clear
error (counted per sample by the batch) rather than returning 0. Each page is written to a
throwaway directory and opened as a file:// URL by a separate Chromium process with its own
profile, DNS resolution disabled, an unreachable proxy, a time budget for scripts, a
wall-clock kill and per-process limits on CPU seconds and data memory (`MEMORY_LIMIT_BYTES`);
nothing from the page runs in this process. Chromium always runs with its own sandbox (never
`--no-sandbox`): as root, the child first enters a network namespace of its own (no interface
but a down loopback: no network at all) and then drops to the unprivileged user `nobody`
before Chromium starts, so neither the browser nor its sandboxed renderers hold root.
Screenshots are compared with `pixels.similarity` (blank-normalised).
"""

from __future__ import annotations

import ctypes
import math
import os
import pwd
import re
import resource
import shutil
import subprocess
import tempfile
from functools import lru_cache

from easyvideor1.records import Sample
from easyvideor1.rewards.config import RewardConfig
from easyvideor1.rewards.format import answer_content, answer_text
from easyvideor1.rewards.pixels import pixel_verdict, png_to_rgb
from easyvideor1.rewards.svg_code import last_element
from easyvideor1.rewards.verdict import Verdict

MAX_HTML_CHARS = 500_000
_FENCE = re.compile(r"```[ \t]*+html?[ \t]*+\n(.*?)```", re.DOTALL | re.IGNORECASE)
_MARKUP = re.compile(
    r"<(?:html|body|div|p|h[1-6]|table|svg|canvas|span|ul|ol|style|main|section)\b", re.I
)
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
MEMORY_LIMIT_BYTES = 1 << 30  # RLIMIT_DATA of each Chromium process: a page cannot take the machine
_CLONE_NEWNET = 0x40000000
_UNPRIVILEGED = "nobody"


def _unprivileged_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(_UNPRIVILEGED)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _confine(cpu_s: int, drop_to: tuple[int, int] | None):
    """What the Chromium child runs before exec: limits; as root, own network namespace, then
    the unprivileged user (in that order: entering a namespace needs root)."""

    def run() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        if drop_to is not None:
            if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed: no network namespace for Chromium")
            uid, gid = drop_to
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

    return run


@lru_cache(maxsize=8)
def find_chromium(path: str | None = None) -> str | None:
    """The Chromium executable: `path` if given, else the first of chromium/chrome on PATH."""
    if path:
        return path if shutil.which(path) else None
    return next((found for name in _BROWSERS if (found := shutil.which(name))), None)


def extract_html(text: str) -> str | None:
    """The page a response gives: last ```html block, else last <html>...</html>, else markup."""
    for part in (answer_text(text), text):
        fenced = _FENCE.findall(part)
        if fenced:
            return fenced[-1]
        document = last_element(part, "html")
        if document:
            start = part.rfind(document)
            head = part[:start].rstrip()
            doctype = head.lower().rfind("<!doctype")  # keep it: it decides standards mode
            if doctype >= 0 and head.endswith(">") and ">" not in head[doctype:-1]:
                return part[doctype:start] + document
            return document
    tail = answer_text(text)
    return tail if _MARKUP.search(tail) else None


@lru_cache(maxsize=64)
def screenshot(html: str, window: tuple[int, int], chromium: str, timeout_s: float):
    """RGB uint8 array [H, W, 3] of the page, or None when Chromium fails or times out."""
    return render_page(html, window, chromium, timeout_s)[0]


class _NoPage(Exception):
    """Chromium made no screenshot of a reference page; the message says why."""


@lru_cache(maxsize=64)
def _reference_screenshot(html: str, window: tuple[int, int], chromium: str, timeout_s: float):
    """A sample's reference page, rendered once per process (each of its responses is compared
    with it). The reference is trusted data, so a failure gets a second try (one seen in a full
    test run beside other heavy work rendered fine alone); a failure raises `_NoPage` and is not
    cached, so the next sample with that page tries again."""
    for _ in range(2):
        image, why = render_page(html, window, chromium, timeout_s)
        if image is not None:
            return image
    raise _NoPage(why)


def render_page(html: str, window: tuple[int, int], chromium: str, timeout_s: float):
    """(`screenshot`'s image or None, why there is none: "" when there is one)."""
    width, height = window
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    drop_to = _unprivileged_ids() if as_root else None
    with tempfile.TemporaryDirectory(prefix="ev1-html-") as work:
        page, shot = os.path.join(work, "page.html"), os.path.join(work, "shot.png")
        with open(page, "w", encoding="utf-8") as f:
            f.write(html)
        if drop_to is not None:  # the unprivileged browser reads the page and writes its profile here
            os.chown(work, *drop_to)
            os.chmod(page, 0o644)
        cmd = [
            chromium, "--headless", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
            "--no-first-run", "--disable-extensions", "--disable-sync", "--disable-dev-shm-usage",
            "--disable-background-networking", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9", "--virtual-time-budget=2000",
            f"--user-data-dir={os.path.join(work, 'profile')}", f"--window-size={width},{height}",
            f"--screenshot={shot}", "file://" + page,
        ]  # fmt: skip
        env = {**os.environ, "HOME": work, "DBUS_SESSION_BUS_ADDRESS": "disabled:"}
        try:
            done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, timeout=timeout_s,
                                  preexec_fn=_confine(math.ceil(timeout_s) + 1, drop_to))
        except subprocess.TimeoutExpired:
            return None, f"Chromium timed out after {timeout_s:g} s"
        if not os.path.exists(shot):
            last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return None, f"Chromium exited with {done.returncode} and no screenshot ({last[0][:200]})"
        with open(shot, "rb") as f:
            return png_to_rgb(f.read(), (width, height)), ""


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = blank-normalised pixel similarity of the two screenshots; 0 for no page."""
    chromium = find_chromium(cfg.chromium)
    if chromium is None:
        raise RuntimeError(
            "html-code scoring needs Chromium: apt-get install -y chromium (or set RewardConfig.chromium)"
        )
    reference = extract_html(sample.answer)
    try:
        if reference is None:
            raise _NoPage("no HTML in it")
        ref_image = _reference_screenshot(reference, cfg.html_window, chromium, cfg.html_timeout_s)
    except _NoPage as e:
        raise ValueError(
            f"html-code sample {sample.problem_id!r}: the answer is not a page Chromium can render ({e})"
        ) from None
    html = extract_html(response)
    content = answer_content(response)
    valid = html is not None and content is not None and extract_html(content) == html
    fits = html is not None and len(html) <= MAX_HTML_CHARS
    image = screenshot(html, cfg.html_window, chromium, cfg.html_timeout_s) if fits else None
    return pixel_verdict(image, ref_image, valid)
