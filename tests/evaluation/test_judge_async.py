"""The LLM judge beside generation: judged rows are scored on the judge's own threads (several
requests in flight at once, which scoring inside the result callback could never do), a
failing request is retried, and what still fails is a failed row in the denominator. The
judge is a real local OpenAI-compatible server (stdlib); the model a tiny real one."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from easyvideor1.data.synth import write_suite
from easyvideor1.evaluation.evaluator import EvalOptions, Evaluator
from easyvideor1.evaluation.settings import DecodingSettings
from easyvideor1.models.tiny import build_tiny_model
from easyvideor1.vision.config import VisionConfig

HOLD_S = 60.0  # a request waits at most this long for the others (then the test fails, not hangs)


class Judge:
    """Answers `Verdict: correct`, except: the first FLAKY request gets 503, every DOWN request
    503, UNREADABLE an unreadable reply. Requests that get a verdict wait until `gather` of them
    are in flight together."""

    def __init__(self, gather: int):
        self.gather, self.arrived, self.gave_up = gather, 0, False
        self.seen: list[str] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                with outer.cond:
                    outer.seen.append(prompt)
                    flaky_first = "FLAKY" in prompt and sum("FLAKY" in p for p in outer.seen) == 1
                    if "DOWN" in prompt or flaky_first:
                        self.send_response(503)
                        self.end_headers()
                        return
                    outer.arrived += 1
                    outer.cond.notify_all()
                    if not outer.cond.wait_for(lambda: outer.arrived >= outer.gather, timeout=HOLD_S):
                        outer.gave_up = True
                text = "I cannot tell." if "UNREADABLE" in prompt else "Same meaning.\nVerdict: correct"
                data = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@pytest.fixture
def judge():
    j = Judge(gather=3)  # OK, FLAKY (on its retry) and UNREADABLE
    yield j
    j.httpd.shutdown()


def test_judge_runs_beside_generation_retries_then_records_failures(judge, tmp_path):
    model = build_tiny_model("qwen2_5_vl", tmp_path / "model", seed=0)
    val = write_suite(tmp_path / "data", num_train=0, num_val=8, seed=1)["val"]
    rows = [json.loads(line) for line in val.read_text().splitlines()]
    video_rows = [r for r in rows if r["data_type"] == "video"]
    bench = []
    for r, tag in zip(video_rows, ("OK", "FLAKY", "UNREADABLE", "DOWN")):
        bench.append({**r, "problem_id": tag, "problem": f"{tag}: describe the square.", "problem_type": "open-ended",
                      "answer": "a small square moves across a dark background", "options": None})
    bench += [r for r in video_rows if r["problem_type"] == "multiple choice"][:2]  # scored inline
    data = tmp_path / "data" / "judged.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in bench))

    vision = VisionConfig(family="qwen2_5_vl", max_frames=4, video_min_pixels=3136, video_max_pixels=12544,
                          image_min_pixels=3136, image_max_pixels=12544)
    out = tmp_path / "out"
    ev = Evaluator(str(model), engine="hf", sampling=DecodingSettings(max_new_tokens=6), vision=vision,
                   options=EvalOptions(out_dir=str(out), cache_mode="realtime", dtype="float32", max_batch=8,
                                       load_workers=2, judge_endpoint=judge.url, judge_model="judge-1",
                                       judge_concurrency=4, judge_retries=1))
    ev.run([str(data)])

    got = {r["id"]: r for r in map(json.loads, (out / "file-judged.jsonl").read_text().splitlines())}
    assert len(got) == len(bench)
    assert not judge.gave_up  # three verdict requests were in flight together
    assert got["OK"]["status"] == "ok" and got["OK"]["score"] == 1.0 and got["OK"]["parts"]["judge"] == 1.0
    assert got["FLAKY"]["status"] == "ok" and got["FLAKY"]["score"] == 1.0
    assert sum("FLAKY" in p for p in judge.seen) == 2  # 503, then the retry
    assert sum("DOWN" in p for p in judge.seen) == 2  # first attempt + one retry, then given up
    assert got["DOWN"]["status"] == "failed" and "judge failed after 2 attempts" in got["DOWN"]["reason"]
    assert got["UNREADABLE"]["status"] == "failed" and "cannot read a verdict" in got["UNREADABLE"]["reason"]
    inline = [r for r in got.values() if r["problem_type"] == "multiple choice"]
    assert len(inline) == 2 and all(r["status"] == "ok" for r in inline)
    summary = json.loads((out / "report.json").read_text())
    assert '"failed": 2' in json.dumps(summary)
