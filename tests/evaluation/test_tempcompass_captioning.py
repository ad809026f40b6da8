"""TempCompass captioning through the judge, on files in the official `questions/` layout: the
judge (a real local OpenAI-compatible server, stdlib) reads only the caption and answers the
video's first multi-choice question of that dimension; the official rule turns its reply into
0/1. Without a judge the rows fail with a message saying what to configure."""

from __future__ import annotations

import json
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from easyvideor1.evaluation.adapters import BENCHMARKS
from easyvideor1.rewards import JudgeConfig, RewardConfig, score


class Judge:
    """Answers from the caption: 'dunk' -> B, 'dribbl' -> A, 'pass' -> 'A. or B.' (two options),
    anything else -> none of the choices."""

    def __init__(self):
        self.prompts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                outer.prompts.append(prompt)
                caption = prompt.split("Video Description:")[1].split("Multi-Choice Question:")[0].lower()
                answer = ("B. dunking a basketball" if "dunk" in caption else "A. dribbling a basketball"
                          if "dribbl" in caption else "A. or B." if "pass" in caption
                          else "None of the choices are correct")
                data = json.dumps({"choices": [{"message": {"content": f"Reasoning: from the caption.\n"
                                                                      f"Answer: {answer}"}}]}).encode()
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
    j = Judge()
    yield j
    j.httpd.shutdown()


def _write(root):
    q = root / "questions"
    q.mkdir(parents=True)
    info = ("Identify the information consistent with the video and write a caption.\n"
            "Information A: {'action': 'dribbling a basketball'}\nInformation B: {'action': 'dunking a basketball'}")
    mcq = {"question": "What is the man doing?\nA. dribbling a basketball\nB. dunking a basketball",
           "answer": "B. dunking a basketball"}
    (q / "captioning.json").write_text(json.dumps({
        "v1": {"action": [{"question": info, "answer": "B. dunking a basketball"},
                          {"question": info, "answer": "B. dunking a basketball"}],
               "speed": [{"question": info, "answer": "B. dunking a basketball"}]},
        "v2": {"action": [{"question": info, "answer": "B. dunking a basketball"},
                          {"question": info, "answer": "B. dunking a basketball"}]}}))
    (q / "multi-choice.json").write_text(json.dumps({
        "v1": {"action": [mcq], "speed": [{**mcq, "question": "How fast?\nA. dribbling a basketball\n"
                                                               "B. dunking a basketball"}]},
        "v2": {"action": [mcq]}}))
    return q / "captioning.json"


def test_captions_judged_by_the_official_rule(judge, tmp_path):
    bench = BENCHMARKS["tempcompass"]
    samples = bench.load(tmp_path, annotation_file=_write(tmp_path))
    assert [s.problem_type for s in samples] == ["caption-mc"] * 5
    assert samples[2].extra["mc_question"].startswith("How fast?")  # the question of its own dimension
    fn = partial(score, cfg=RewardConfig(judge=JudgeConfig(endpoint=judge.url, model="j", backoff_s=0.01)))
    plan = [("<answer>A man dunks a basketball.</answer>", 1.0),  # judge picks B = the key
            ("<answer>A man dribbles a basketball.</answer>", 0.0),  # judge picks A
            ("<answer>He dunks it hard.</answer>", 1.0),  # speed: B
            ("<answer>He passes the ball.</answer>", 0.0)]  # "A. or B.": two options named -> 0
    rows = [bench.result_row(s, r, score_fn=fn) for s, (r, _) in zip(samples, plan)]
    assert [r.score for r in rows] == [v for _, v in plan] and all(r.status == "ok" for r in rows)
    rows.append(bench.failed_row(samples[4], "generation failed"))
    assert "Video Description: A man dunks a basketball." in judge.prompts[0]
    agg = bench.aggregate(rows)
    # 2 right of 5; action: v1/0 right, v1/1 wrong, v2/0 wrong, v2/1 failed -> 1/4; speed 1/1
    assert agg.overall == pytest.approx(2 / 5) and (agg.count, agg.failed) == (5, 1)
    got = {k: {l: (c.score, c.count, c.failed) for l, c in t.items()} for k, t in agg.categories.items()}
    assert got == {"dimension": {"action": (0.25, 4, 1), "speed": (1.0, 1, 0)},
                   "task_type": {"captioning": (0.4, 5, 1)}}


def test_captions_without_a_judge_fail_with_the_reason(tmp_path):
    bench = BENCHMARKS["tempcompass"]
    sample = bench.load(tmp_path, annotation_file=_write(tmp_path))[0]
    row = bench.result_row(sample, "<answer>A man dunks a basketball.</answer>")
    assert row.status == "failed" and "--judge-endpoint" in row.reason
