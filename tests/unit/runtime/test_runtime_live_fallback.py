"""The fallback settings file (CHATFLEET_FALLBACK_FILE) changes the FAQ and the breaker of a running chat
API: the poller on its own (a temporary file, an injected clock), then through the real app.

Test design: the poller is driven by direct calls to poll(), so each content's effect is checked without
waiting; the app test lets the app's own background task pick up a rewrite (a bounded wait) and asks the
chat route with a backend that is down, so every answer comes from the fallback.
"""

from __future__ import annotations

import asyncio
import doctest
import json
import logging
import os
import time

import pytest
from chatfleet_runtime.chat import breaker as breaker_module
from chatfleet_runtime.chat import livesettings
from chatfleet_runtime.chat.api import ApiSettings, create_app
from chatfleet_runtime.chat.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, Fallback
from chatfleet_runtime.chat.livesettings import FallbackSettings, LiveSettings
from fastapi.testclient import TestClient
from test_runtime_chat_api import FakeBackend, metric, post

ENV_FAQ = '[{"keywords": ["refund"], "answer": "env refund"}]'


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def ask(fallback: Fallback, text: str) -> tuple[str, str]:
    return fallback.answer([{"role": "user", "content": text}])


@pytest.fixture
def live(tmp_path):
    """A poller over a file not written yet, with the environment's FAQ and thresholds 3 / 5 s."""
    fallback = Fallback.from_config("busy", ENV_FAQ)
    breaker = CircuitBreaker(3, 5.0, clock=Clock())
    results: list[str] = []
    poller = LiveSettings(
        tmp_path / "fallback",
        FallbackSettings(fallback.faq, 3, 5.0),
        fallback,
        breaker,
        on_result=results.append,
    )
    poller.results = results  # type: ignore[attr-defined]
    return poller


def write(live: LiveSettings, content: str | dict) -> None:
    live.path.write_text(content if isinstance(content, str) else json.dumps(content))


NEW = {
    "faq": [{"question": "How do I reset my password?", "answer": "file password"}],
    "breaker": {"failures": 2, "resetSeconds": 7},
}


def test_poll_applies_a_faq_and_breaker_change(live):
    write(live, NEW)
    assert live.poll() == "applied"
    assert ask(live.fallback, "how to reset my password") == ("file password", "faq")
    assert ask(live.fallback, "a refund please") == ("busy", "text")  # the env's FAQ is replaced
    assert (live.breaker.failure_threshold, live.breaker.reset_timeout_s) == (2, 7.0)
    assert live.poll() is None and live.results == ["applied"]  # the same content: nothing done again


def test_absent_keys_take_the_environments_values(live):
    write(live, {"breaker": {"resetSeconds": 9}})
    assert live.poll() == "applied"
    assert ask(live.fallback, "a refund please") == ("env refund", "faq")
    assert (live.breaker.failure_threshold, live.breaker.reset_timeout_s) == (3, 9.0)


@pytest.mark.parametrize("how", ["emptied", "removed"])
def test_an_emptied_or_removed_file_goes_back_to_the_environments_settings(live, how):
    write(live, NEW)
    live.poll()
    if how == "emptied":
        write(live, "")
    else:
        live.path.unlink()
    assert live.poll() == "applied"
    assert ask(live.fallback, "a refund please") == ("env refund", "faq")
    assert ask(live.fallback, "how to reset my password") == ("busy", "text")
    assert (live.breaker.failure_threshold, live.breaker.reset_timeout_s) == (3, 5.0)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param('{"faq": [', id="bad-json"),
        pytest.param('[{"keywords": ["x"], "answer": "y"}]', id="not-an-object"),
        pytest.param({"faq": [{"keywords": ["refund"]}]}, id="entry-without-answer"),
        pytest.param({"faq": [{"keywords": "refund", "answer": "y"}]}, id="keywords-a-string"),
        pytest.param({"faq": {"keywords": ["refund"], "answer": "y"}}, id="faq-not-a-list"),
        pytest.param({"breaker": {"failures": "2"}}, id="failures-a-string"),
        pytest.param({"breaker": {"failures": 0}}, id="failures-zero"),
        pytest.param({"breaker": {"resetSeconds": True}}, id="reset-a-bool"),
        pytest.param({"breaker": [2, 7]}, id="breaker-not-an-object"),
    ],
)
def test_an_invalid_file_keeps_the_last_good_settings_and_counts_once(live, content, caplog):
    write(live, NEW)
    live.poll()
    write(live, content)
    with caplog.at_level(logging.WARNING, logger="chatfleet.api"):
        assert [live.poll() for _ in range(3)] == ["invalid", None, None]
    assert live.results == ["applied", "invalid"]
    assert len([r for r in caplog.records if "not applied" in r.getMessage()]) == 1
    assert ask(live.fallback, "how to reset my password") == ("file password", "faq")
    assert (live.breaker.failure_threshold, live.breaker.reset_timeout_s) == (2, 7.0)
    assert live.current.failures == 2


def test_the_breaker_keeps_its_state_across_a_reconfigure():
    clock = Clock()
    b = CircuitBreaker(3, 5.0, clock=clock)
    b.record_failure()
    b.record_failure()
    b.configure(3, 5.0)
    b.record_failure()  # the count survived: the third failure opens it
    assert b.state == OPEN
    clock.t = 4.0
    b.configure(2, 10.0)  # open stays open, timed from when it opened
    assert b.state == OPEN and not b.allow()
    clock.t = 10.0
    assert b.state == HALF_OPEN
    assert b.allow()
    b.record_success()
    assert b.state == CLOSED


def test_the_breaker_takes_a_lower_threshold_at_the_next_failure():
    b = CircuitBreaker(5, 5.0, clock=Clock())
    b.record_failure()
    b.configure(2, 5.0)
    assert b.state == CLOSED
    b.record_failure()
    assert b.state == OPEN


def test_settings_from_env():
    s = ApiSettings.from_env(
        {
            "CHATFLEET_FALLBACK_FILE": "/etc/chatfleet/fallback/fallback",
            "CHATFLEET_FALLBACK_RELOAD_SECONDS": "0.5",
        }
    )
    assert (s.fallback_file, s.fallback_reload_s) == ("/etc/chatfleet/fallback/fallback", 0.5)
    assert (ApiSettings.from_env({}).fallback_file, ApiSettings.from_env({}).fallback_reload_s) == (None, 2.0)


def test_the_docstring_examples_hold():
    for module in (livesettings, breaker_module):
        failed, tried = doctest.testmod(module)
        assert tried and not failed, module.__name__


def replace(path, text: str) -> None:
    """Write the file in one step, as kubelet does (a new file renamed over the old): the app's poller,
    running meanwhile, never reads it half written."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def answer(client, text: str) -> str:
    body = post(client, {"messages": [{"role": "user", "content": text}]}).json()
    assert body["chatfleet"]["fallback"] is True
    return body["choices"][0]["message"]["content"]


def wait_for(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the running app did not pick up the file"
        time.sleep(0.02)


def test_the_running_app_follows_the_file_without_a_restart(tmp_path):
    path = tmp_path / "fallback"
    path.write_text(json.dumps({"faq": [{"keywords": ["refund"], "answer": "refund v1"}]}))
    settings = ApiSettings(
        model_name="m1",
        max_new_tokens=50,
        faq=ENV_FAQ,
        fallback_text="busy",
        fallback_file=str(path),
        fallback_reload_s=0.02,
    )
    backend = FakeBackend()
    backend.mode = "down"  # every answer is the fallback's
    app = create_app(settings, backend=backend)
    with TestClient(app) as client:
        assert answer(client, "a refund please") == "refund v1"
        replace(
            path,
            json.dumps(
                {
                    "faq": [{"question": "Where is my parcel?", "answer": "parcel v2"}],
                    "breaker": {"failures": 1, "resetSeconds": 60},
                }
            ),
        )
        wait_for(lambda: answer(client, "where is my parcel") == "parcel v2")
        assert answer(client, "a refund please") == "busy"
        assert app.state.breaker.failure_threshold == 1 and app.state.breaker.reset_timeout_s == 60
        # what is in force shows on /metrics (what a real-pod test and an operator can read)
        assert metric(client, "chatfleet_breaker_failure_threshold") == 1
        assert metric(client, "chatfleet_fallback_faq_entries") == 1
        replace(path, "{not json")
        wait_for(lambda: metric(client, "chatfleet_fallback_settings_reloads_total", result="invalid") == 1)
        assert answer(client, "where is my parcel") == "parcel v2"  # the last good settings stay
        assert metric(client, "chatfleet_fallback_settings_reloads_total", result="applied") == 2
        assert not app.state.fallback_watch.done()


def test_the_app_reads_the_file_before_serving_and_stops_polling_on_shutdown(tmp_path):
    path = tmp_path / "fallback"
    path.write_text(json.dumps({"faq": [{"keywords": ["refund"], "answer": "refund v1"}]}))
    settings = ApiSettings(model_name="m1", max_new_tokens=50, fallback_file=str(path), fallback_reload_s=60)
    app = create_app(settings, backend=FakeBackend())

    async def run() -> bool:
        async with app.router.lifespan_context(app):
            # the background task has not run yet: the start-up itself read the file
            assert ask(app.state.pipeline.fallback, "a refund") == ("refund v1", "faq")
            watch = app.state.fallback_watch
            await asyncio.sleep(0)
            assert not watch.done()
        return watch.cancelled()  # while the loop still runs (asyncio.run cancels what is left)

    assert asyncio.run(run())


def test_without_a_file_the_app_polls_nothing(tmp_path):
    settings = ApiSettings(model_name="m1", max_new_tokens=50, faq=ENV_FAQ, fallback_text="busy")
    backend = FakeBackend()
    backend.mode = "down"
    app = create_app(settings, backend=backend)
    with TestClient(app) as client:
        assert app.state.pipeline.live is None and app.state.fallback_watch is None
        assert answer(client, "a refund please") == "env refund"
        assert (
            "chatfleet_fallback_settings_reloads_total{"
            not in client.get("http://testserver:8090/metrics").text
        )
