"""DialogueLoad counts what the zero-drop tests assert on: cut streams, non-2xx, lost histories, switches.

Test design: a scripted chat server on 127.0.0.1 answers each turn by a rule of the test (a revision per
turn, a cut, a 503, a short history); the load's counts must match the script exactly.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from chatfleet_platform.load.dialogues import DialogueLoad

pytestmark = pytest.mark.harness


def serve(script):
    """A chat server whose answer to turn k of a session is script(k, pinned_revision) -> (kind, revision, turns)."""
    seen: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            sid = self.headers["X-Session-Id"]
            with lock:
                k = seen[sid] = seen.get(sid, -1) + 1
            kind, revision, turns = script(k, self.headers.get("x-chatfleet-revision", ""))
            if kind == "503":
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("x-chatfleet-revision", revision)
            self.send_header("x-gateway-upstream", f"replica-{k // 2}")  # turns 0-1, 2-3, 4 on three replicas
            self.end_headers()
            meta = {"history_turns": turns, "history": "ok"}
            if kind == "fallback":  # the chat API's fallback text instead of the model (not stored)
                meta.update(fallback=True, reason="timeout")
            head = {"choices": [{"delta": {"content": "hi"}}], "chatfleet": meta}
            self.wfile.write(f"data: {json.dumps(head)}\n\n".encode())
            if kind != "cut":
                self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run(script, **kw):
    server = serve(script)
    try:
        load = DialogueLoad(f"http://127.0.0.1:{server.server_port}", think_seconds=(0, 0), **kw).start()
        assert load.wait(30)
        return load.summary()
    finally:
        server.shutdown()


def test_a_clean_pinned_dialogue_counts_nothing_bad():
    s = run(lambda k, pin: ("ok", pin or "a1", k), concurrency=2, max_dialogues=4, turns=5)
    assert (s["turns"], s["ok"], s["dialogues"]) == (20, 20, 4)
    assert (s["cut"], s["non_2xx"], s["failed"], s["lost_history"], s["switched"]) == (0, 0, 0, 0, 0)


def test_the_first_answers_revision_is_echoed_and_a_switch_is_counted_once_a_dialogue():
    echoed = []

    def script(k, pin):
        echoed.append(pin)
        return ("ok", "a1" if k < 2 else "b2", k)

    s = run(script, concurrency=1, max_dialogues=2, turns=4)
    assert s["switched"] == 2 and s["switched_share"] == 1.0
    assert set(echoed) == {"", "a1"}
    unpinned = run(lambda k, pin: ("ok", "a1", k), concurrency=1, max_dialogues=1, turns=3, pin=False)
    assert unpinned["switched"] == 0


def test_cut_streams_non_2xx_and_lost_histories():
    def script(k, pin):
        return {0: ("ok", "a1", 0), 1: ("cut", "a1", 1), 2: ("503", "", 0), 3: ("ok", "a1", 0)}[k]

    s = run(script, concurrency=1, max_dialogues=1, turns=4)
    assert (s["cut"], s["non_2xx"], s["codes"]) == (1, 1, {"http-503": 1})
    # turn 3 follows two saved turns? No: the cut turn was not saved, turn 0 was -> 0 < 1 is a lost history
    assert s["lost_history"] == 1


def test_a_lost_history_is_listed_with_the_turn_before_it_and_fallback_answers_are_counted():
    def script(k, pin):
        return {0: ("ok", "a1", 0), 1: ("fallback", "a1", 1), 2: ("ok", "a1", 1)}[k]

    server = serve(script)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        load = DialogueLoad(url, think_seconds=(0, 0), concurrency=1, max_dialogues=1, turns=3).start()
        assert load.wait(30)
    finally:
        server.shutdown()
    s = load.summary()
    assert (s["ok"], s["lost_history"], s["fallbacks"], s["errors"]) == (3, 1, {"timeout": 1}, {})
    (lost,) = load.bad_turns()
    assert lost.lost and lost.outcome == "ok" and lost.history == "ok"
    assert lost.error == (
        "history ok from a1: 1 of 2 saved turns loaded (previous turn ok from a1, a fallback answer (timeout))"
    )
    assert s["lost"] == [lost.error]
    assert load.failures_between(lost.at, lost.at + 1) == 1


def test_a_refused_connection_is_a_failure():
    load = DialogueLoad("http://127.0.0.1:9", think_seconds=(0, 0), concurrency=1, max_dialogues=1, turns=2)
    assert load.start().wait(30)
    assert load.summary()["failed"] == 2


def test_each_dialogue_arrives_from_an_address_that_rested():
    load = DialogueLoad("http://127.0.0.1:9", sources=("a", "b"), reuse_after=100.0)
    first, second = load._address(), load._address()
    assert {first, second} == {"a", "b"}
    load._release(first)
    load._stop.set()  # both resting or in use: a third dialogue would wait; stopped, it gets none
    assert load._address() is None


def test_the_replica_of_each_turn_is_recorded_and_a_move_counted():
    """Turns 0-1 on replica-0, 2-3 on replica-1, 4 on replica-2: of the 4 turns after a first, 2 stayed."""
    server = serve(lambda k, pin: ("ok", "a", None))
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        load = DialogueLoad(url, think_seconds=(0, 0), turns=5, concurrency=1, max_dialogues=2,
                            upstream_header="x-gateway-upstream").start()  # fmt: skip
        assert load.wait(30)
    finally:
        server.shutdown()
    replicas = ("replica-0", "replica-0", "replica-1", "replica-1", "replica-2")
    assert [r.replicas for r in load.records] == [replicas, replicas]
    assert load.kept_replica(0, float("inf")) == (8, 4)
    assert DialogueLoad("http://x").kept_replica(0, 1) == (0, 0)
