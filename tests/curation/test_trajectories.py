"""`easyvideor1 trajectories`: a local teacher on the synthetic suite, whose output trains with
hybrid groups; and an OpenAI-compatible endpoint (a real HTTP server in a thread) that answers
right, wrong, fails once, or always fails."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from curationfixtures import TINY

from easyvideor1.cli import main
from easyvideor1.data.loading import load_samples
from easyvideor1.rewards import score


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _check_outputs(inputs, out, rejected):
    kept, rest = _read(out), _read(rejected)
    assert Counter(r["problem_id"] for r in kept + rest) == Counter(inputs["ids"])  # each once
    samples = {s.problem_id: s for s in load_samples(inputs["data"])}
    for r in kept:  # only responses the rewards call correct are written
        assert r["has_offline_trajectory"] is True
        assert score(r["offline_output"], samples[r["problem_id"]]).accuracy == 1.0
    bad = {r["problem_id"]: r for r in rest}
    assert bad["corrupt-video"]["rejected_failed"] and "corrupt.mp4" in bad["corrupt-video"]["rejected_reason"]
    return kept, bad


def test_local_teacher_output_trains_with_hybrid_groups(curation_inputs, tmp_path, capsys):
    out = tmp_path / "traj.jsonl"
    argv = ["trajectories", "--teacher", str(curation_inputs["teacher"]), "--data", str(curation_inputs["data"]),
            "--out", str(out), "--k", "4", "--engine", "hf", "--max-tokens", "1", "--score-workers", "0", *TINY]
    assert main(argv) == 0
    kept, bad = _check_outputs(curation_inputs, out, tmp_path / "traj.rejected.jsonl")
    assert len(kept) >= 2, bad
    assert not any(r["problem_type"] == "numerical" for r in kept)  # letters never answer a count
    assert "| numerical | 0 | 3 | 0 |" in capsys.readouterr().out
    assert main(argv) == 0  # resumed: nothing left, nothing written twice
    _check_outputs(curation_inputs, out, tmp_path / "traj.rejected.jsonl")

    run = tmp_path / "run"
    assert main(["train", f"model.path={curation_inputs['model']}", f"data.train_files={out}",
                 f"data.data_root={curation_inputs['data'].parent}",  # media paths stay as in the input
                 f"logging.out_dir={run}", "model.dtype=float32", "vision.max_frames=8",
                 "vision.video_min_pixels=3136", "vision.video_max_pixels=12544", "vision.image_min_pixels=3136",
                 "vision.image_max_pixels=12544", "rollout.n=2", "rollout.max_tokens=8", "training.steps=2",
                 "training.rollout_batch_size=2", "training.mini_batch_size=2", "training.micro_batch_size=2",
                 "hybrid.enable=true", "logging.progress=false", "checkpoint.every=0",
                 "checkpoint.export_hf=false"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["hybrid/groups_replaced"] for r in rows) == 4  # every group got its trajectory


class _Teacher(BaseHTTPRequestHandler):
    """Answers by the sample id in the prompt: `right`, `wrong`, `flaky` (500 on its first request,
    then right), `down` (always 503), `bad` (400, not retried)."""

    behaviour: dict[str, str] = {}
    answers: dict[str, str] = {}
    hits: Counter = Counter()
    images: Counter = Counter()
    stamps: dict[str, list[str]] = {}
    lock = threading.Lock()

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        parts = body["messages"][0]["content"]
        pid = re.search(r"\[id (\S+)\]", parts[-1]["text"]).group(1)
        with self.lock:
            self.hits[pid] += 1
            first = self.hits[pid] == 1
            self.images[pid] = sum(p["type"] == "image_url" and p["image_url"]["url"].startswith("data:image/jpeg;base64,")
                                   for p in parts)
            self.stamps[pid] = [p["text"] for p in parts[:-1] if p["type"] == "text"]
        how = self.behaviour[pid]
        if how == "down" or (how == "flaky" and first):
            return self._send(503 if how == "down" else 500, {"error": "busy"})
        if how == "bad":
            return self._send(400, {"error": "bad request"})
        answer = self.answers[pid] if how in ("right", "flaky") else ("9" if self.answers[pid] in "ABCD" else "A")
        self._send(200, {"choices": [{"message": {"role": "assistant", "content":
                                                  f"<think>I looked.</think><answer>{answer}</answer>"},
                                      "finish_reason": "stop"}]})

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def teacher_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Teacher)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_endpoint_keeps_only_correct_answers_and_retries(curation_inputs, tmp_path, teacher_server, capsys):
    records = [dict(r, problem=f"{r['problem']} [id {r['problem_id']}]") for r in curation_inputs["records"][:7]]
    data = curation_inputs["data"].with_name("endpoint.jsonl")
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    ids = [r["problem_id"] for r in records]
    plan = dict(zip([i for i in ids if i != "corrupt-video"], ["right", "wrong", "flaky", "down", "bad", "right"]))
    _Teacher.behaviour, _Teacher.answers = plan, {r["problem_id"]: r["answer"] for r in records}
    _Teacher.hits.clear()
    out = tmp_path / "teacher.jsonl"
    assert main(["trajectories", "--endpoint", teacher_server, "--endpoint-model", "big-teacher",
                 "--data", str(data), "--out", str(out), "--k", "2", "--retries", "2", "--backoff", "0.01",
                 "--score-workers", "0", "--max-tokens", "64", *TINY[2:]]) == 0
    inputs = dict(curation_inputs, data=data, ids=ids)
    kept, bad = _check_outputs(inputs, out, tmp_path / "teacher.rejected.jsonl")
    expect_kept = {pid for pid, how in plan.items() if how in ("right", "flaky")}
    assert {r["problem_id"] for r in kept} == expect_kept
    down = next(pid for pid, how in plan.items() if how == "down")
    assert bad[down]["rejected_failed"] and "after 3 attempts" in bad[down]["rejected_reason"]
    assert _Teacher.hits[down] == 2 * 3  # k requests, each tried 1 + 2 retries
    flaky = next(pid for pid, how in plan.items() if how == "flaky")
    assert _Teacher.hits[flaky] == 2 + 1  # its first request failed once and was retried
    rejected_bad = next(pid for pid, how in plan.items() if how == "bad")
    assert bad[rejected_bad]["rejected_failed"] and "HTTP 400" in bad[rejected_bad]["rejected_reason"]
    assert _Teacher.hits[rejected_bad] == 2  # a 400 is not retried
    wrong = next(pid for pid, how in plan.items() if how == "wrong")
    assert not bad[wrong]["rejected_failed"] and "no response" in bad[wrong]["rejected_reason"]
    assert "corrupt-video" not in _Teacher.hits  # never sent
    video = ids[0]  # a video sample: its frames went as JPEG images, each after its timestamp
    assert _Teacher.images[video] == 8 and sum(re.fullmatch(r"<\d+\.\d s>", t) is not None
                                               for t in _Teacher.stamps[video]) == 8
    printed = capsys.readouterr().out
    assert "retries" in printed and f"failed: {down}" in printed
