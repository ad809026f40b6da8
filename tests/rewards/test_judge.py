"""LLM judge: verdict parsing on recorded texts, and the HTTP client against a real local
OpenAI-compatible server (stdlib, started here) that can hold requests and fail on demand.
No test starts `vllm serve` itself: the client's contract is the OpenAI chat-completions API,
which this server speaks.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from easyvideor1.records import Sample
from easyvideor1.rewards import JudgeConfig, RewardConfig, score
from easyvideor1.rewards.batch import score_batch
from easyvideor1.rewards.judge import JudgeError, judge_many, judge_one, parse_verdict

RECORDED = [
    ("The model says the kitchen; the reference says kitchen. Same place.\nVerdict: correct", 1.0),
    (
        "Both mention a red car but the model gets the color of the house wrong.\nVerdict: partially correct",
        0.5,
    ),
    ("The reference is 'three people', the model says five.\n\nVerdict: incorrect", 0.0),
    ("Verdict: **Correct**", 1.0),
    ("Analysis: ... The answer is wrong.\nVerdict: Incorrect.", 0.0),
    (
        "Reasoning first. Verdict: correct. Wait, re-reading: no. Verdict: incorrect",
        0.0,
    ),  # last one wins
    ("[[CORRECT]]", 1.0),
    ("After comparison: [[incorrect]]", 0.0),
    ("Score: 8/10", 0.8),
    ("Rating: 3/5", 0.6),
    ("correct", 1.0),
    ("The answers differ in detail but agree on the event.\nCorrect.", 1.0),
    ("I cannot decide without the video.", None),
    ("", None),
]


@pytest.mark.parametrize("text, verdict", RECORDED)
def test_parse_recorded_verdicts(text, verdict):
    assert parse_verdict(text) == verdict


class Server:
    """OpenAI-compatible /v1/chat/completions with scripted behaviour per request number.

    Nothing here depends on how fast the machine is: a request planned as "hold" waits until the
    test ends (its client must time out), and with `gather` set every request waits until that
    many have arrived, so they are all in flight at once, or until HOLD_S passed once (then the
    rest go through, and the test's count of overlapping requests fails instead of hanging).
    """

    HOLD_S = 60.0

    def __init__(self):
        self.requests, self.in_flight, self.max_in_flight = [], 0, 0
        self.lock = threading.Condition()  # guards the fields below; notified at each arrival
        self.plan = {}  # request index -> ("hold", verdict) | ("status", code) | ("text", verdict)
        self.gather = 0
        self.gave_up = False
        self.ended = threading.Event()  # set at teardown: releases held requests
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    index = len(outer.requests)
                    outer.requests.append((self.path, dict(self.headers), body))
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    outer.lock.notify_all()
                    arrived = lambda: len(outer.requests) >= outer.gather or outer.gave_up  # noqa: E731
                    if not outer.lock.wait_for(arrived, timeout=outer.HOLD_S):
                        outer.gave_up = True
                        outer.lock.notify_all()
                try:
                    kind, value = outer.plan.get(index, ("text", None))
                    if kind == "hold":
                        outer.ended.wait(outer.HOLD_S)
                    if kind == "status":
                        self.send_response(value)
                        self.end_headers()
                        return
                    prompt = body["messages"][0]["content"]
                    answer = prompt.split("Model answer:")[1].split("\n")[0]
                    text = value or (
                        "Verdict: correct" if "kitchen" in answer.lower() else "Verdict: incorrect"
                    )
                    payload = json.dumps(
                        {"choices": [{"message": {"role": "assistant", "content": text}}]}
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.ended.set()
    s.httpd.shutdown()
    s.httpd.server_close()


def config(server, **kw):
    # timeout_s: far above any local round trip, even on a busy machine (only
    # test_timeout_then_retry wants timeouts, and sets its own).
    return JudgeConfig(
        endpoint=server.url, **{"model": "judge-tiny", "backoff_s": 0.05, "timeout_s": 120.0, **kw}
    )


def test_request_shape_and_verdict(server, monkeypatch):
    monkeypatch.setenv("EV1_TEST_KEY", "sekret")
    assert (
        judge_one(config(server, api_key_env="EV1_TEST_KEY"), "Where?", "kitchen", "in the kitchen")
        == 1.0
    )
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sekret"
    assert body["model"] == "judge-tiny" and body["temperature"] == 0.0
    assert "Reference answer: kitchen" in body["messages"][0]["content"]


def test_retry_after_server_error(server):
    server.plan = {0: ("status", 503)}
    assert judge_one(config(server), "q", "kitchen", "garage") == 0.0
    assert len(server.requests) == 2


def test_timeout_then_retry(server):
    """The first request never answers (until teardown, when it would say "incorrect"): the
    verdict can only come from a retry after the client's timeout."""
    server.plan = {0: ("hold", "Verdict: incorrect")}
    assert judge_one(config(server, timeout_s=1.0), "q", "kitchen", "kitchen!") == 1.0
    assert len(server.requests) >= 2  # more than one retry only if a retry also timed out


def test_failures_raise(server):
    server.plan = {i: ("status", 500) for i in range(10)}
    with pytest.raises(JudgeError, match="after 3 attempts"):
        judge_one(config(server, max_retries=2), "q", "a", "b")
    server.requests.clear()
    server.plan = {0: ("status", 400)}
    with pytest.raises(JudgeError):
        judge_one(config(server), "q", "a", "b")
    assert len(server.requests) == 1  # a client error is not retried
    server.requests.clear()
    server.plan = {0: ("text", "Hmm, hard to say.")}
    with pytest.raises(JudgeError, match="cannot read a verdict"):
        judge_one(config(server), "q", "a", "b")


def test_disk_cache_keyed_by_prompt_and_model(server, tmp_path):
    cfg = config(server, cache_dir=str(tmp_path))
    assert judge_one(cfg, "q", "kitchen", "kitchen area") == 1.0
    assert judge_one(cfg, "q", "kitchen", "kitchen area") == 1.0
    assert len(server.requests) == 1
    judge_one(
        config(server, cache_dir=str(tmp_path), model="other"), "q", "kitchen", "kitchen area"
    )
    assert len(server.requests) == 2


def test_many_concurrent_with_failures_in_their_slots(server):
    """All 8 requests are in flight at once: the server answers none before the 8th arrives
    (a client that waited for answers would stall HOLD_S, then fail the count)."""
    server.gather = 8
    server.plan = {3: ("status", 400)}
    items = [("q", "kitchen", "kitchen" if i % 2 else "garage") for i in range(8)]
    verdicts = judge_many(config(server, concurrency=8), items)
    assert server.max_in_flight == 8 and not server.gave_up
    assert (
        sum(isinstance(v, JudgeError) for v in verdicts) == 1
    )  # the 4th request to arrive got a 400
    for (_, _, answer), verdict in zip(items, verdicts):
        assert isinstance(verdict, JudgeError) or verdict == (1.0 if answer == "kitchen" else 0.0)


def test_open_ended_uses_the_judge_and_batch_prefetches(server, tmp_path):
    cfg = RewardConfig(judge=config(server, cache_dir=str(tmp_path)))
    sample = Sample(problem="Where?", answer="<answer>kitchen</answer>", problem_type="open-ended")
    result = score("<think>.</think><answer>in the cooking room (kitchen)</answer>", sample, cfg)
    assert result.accuracy == 1.0 and result.parts["judge"] == 1.0 and result.parts["rouge"] < 1.0
    assert score("<think>.</think><answer>Kitchen</answer>", sample, cfg).accuracy == 1.0
    assert len(server.requests) == 1  # exact matches need no judge

    samples = [
        Sample(problem="Where?", answer="kitchen", problem_type="open-ended", problem_id=str(i))
        for i in range(4)
    ]
    responses = ["the kitchen area", "garage", "a garden", "kitchen"]
    results = score_batch(responses, samples, cfg, workers=2)
    assert [r.accuracy for r in results] == [1.0, 0.0, 0.0, 1.0]
    assert len(server.requests) == 1 + 3  # prefetched once each; the workers read the cache
