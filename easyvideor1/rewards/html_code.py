"""HTML code: screenshot the response's page and the reference in headless Chromium, compare.

Needs Debian's `chromium` (`apt-get install -y chromium`); without it scoring raises a clear
error (counted per sample by the batch) rather than returning 0. Each page is written to a
throwaway directory and opened as a file:// URL by a separate Chromium process with its own
profile, DNS resolution disabled, an unreachable proxy (no network), a time budget for
scripts and a wall-clock kill; nothing from the page runs in this process. `--no-sandbox` is
added only when running as root, where Chromium refuses its own sandbox.
Screenshots are compared with `pixels.similarity` (blank-normalised).
"""

from __future__ import annotations

import os
import re
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
    width, height = window
    with tempfile.TemporaryDirectory(prefix="ev1-html-") as work:
        page, shot = os.path.join(work, "page.html"), os.path.join(work, "shot.png")
        with open(page, "w", encoding="utf-8") as f:
            f.write(html)
        cmd = [
            chromium, "--headless", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
            "--no-first-run", "--disable-extensions", "--disable-sync", "--disable-dev-shm-usage",
            "--disable-background-networking", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9", "--virtual-time-budget=2000",
            f"--user-data-dir={os.path.join(work, 'profile')}", f"--window-size={width},{height}",
            f"--screenshot={shot}", "file://" + page,
        ]  # fmt: skip
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")
        env = {**os.environ, "HOME": work, "DBUS_SESSION_BUS_ADDRESS": "disabled:"}
        try:
            subprocess.run(cmd, env=env, cwd=work, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        if not os.path.exists(shot):
            return None
        with open(shot, "rb") as f:
            return png_to_rgb(f.read(), (width, height))


def score(response: str, sample: Sample, cfg: RewardConfig) -> Verdict:
    """Accuracy = blank-normalised pixel similarity of the two screenshots; 0 for no page."""
    chromium = find_chromium(cfg.chromium)
    if chromium is None:
        raise RuntimeError(
            "html-code scoring needs Chromium: apt-get install -y chromium (or set RewardConfig.chromium)"
        )
    reference = extract_html(sample.answer)
    ref_image = (
        screenshot(reference, cfg.html_window, chromium, cfg.html_timeout_s) if reference else None
    )
    if ref_image is None:
        raise ValueError(
            f"html-code sample {sample.problem_id!r}: the answer is not a page Chromium can render"
        )
    html = extract_html(response)
    content = answer_content(response)
    valid = html is not None and content is not None and extract_html(content) == html
    fits = html is not None and len(html) <= MAX_HTML_CHARS
    image = screenshot(html, cfg.html_window, chromium, cfg.html_timeout_s) if fits else None
    return pixel_verdict(image, ref_image, valid)
