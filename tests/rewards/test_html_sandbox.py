"""The HTML reward's Chromium is confined: as root it runs as `nobody` in a network namespace
of its own (never `--no-sandbox`), with its CPU seconds and data memory limited. Checked on a
real child process and on real Chromium renders."""

import http.server
import os
import subprocess
import threading

import pytest

from easyvideor1.rewards.html_code import MEMORY_LIMIT_BYTES, _confine, _unprivileged_ids, find_chromium, screenshot

as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="the root path needs root")
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="Chromium not installed")

# bash, not Python: the unprivileged user may not be able to read this interpreter's files.
PROBE = ("echo $(id -u) $(id -g) $(id -G | wc -w) $(ulimit -d) $(ulimit -t) "
         "$( (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && echo reached || echo unreachable)")


@pytest.fixture
def local_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@as_root
def test_the_child_is_unprivileged_offline_and_limited(local_server):
    uid, gid = _unprivileged_ids()
    assert uid != 0 and gid != 0
    out = subprocess.run(["bash", "-c", PROBE, "probe", str(local_server)], capture_output=True, text=True,
                         preexec_fn=_confine(7, (uid, gid)), timeout=60, check=True).stdout.split()
    assert out == [str(uid), str(gid), "1", str(MEMORY_LIMIT_BYTES // 1024), "7", "unreachable"]
    # the same probe without the confinement reaches the server (the check has teeth)
    plain = subprocess.run(["bash", "-c", PROBE, "probe", str(local_server)], capture_output=True, text=True,
                           timeout=60, check=True).stdout.split()
    assert plain[0] == "0" and plain[-1] == "reached"


@needs_chromium
def test_a_page_cannot_take_more_memory_than_the_limit():
    # Blue only if the page could allocate 3 GB; red (its own first paint) otherwise.
    hog = ("<html><body style='margin:0;background:#f00'><script>let a=[];"
           "for(let i=0;i<30;i++)a.push(new Uint8Array(100e6).fill(1));"
           "document.body.style.background='#00f'</script></body></html>")
    small = hog.replace("i<30", "i<2")
    red, blue = [255, 0, 0], [0, 0, 255]
    assert screenshot(small, (64, 48), find_chromium(), 30.0)[10, 10].tolist() == blue  # scripts run
    image = screenshot(hog, (64, 48), find_chromium(), 30.0)
    assert image is None or image[10, 10].tolist() == red
