"""`kubectl chatbot status --timeout / --watch`, `-A` and `--context` (the plugin's CI and fleet views).

Test design: the outcome of a rollout is a pure function of the object, checked on a table of statuses;
the waiting loop runs on an injected clock and sleep with the object's reads replaced, so each exit code
is reached without an API server; `get -A` and `--context` are checked at the plugin's one door to the
API (kube.request, kube.configure).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import urllib3
from chatfleet_operator import api, kube, plugin


def cbs(
    generation=2,
    observed=2,
    ready="True",
    reconciling="False",
    stalled="False",
    stable="r2",
    update="r2",
    release=None,
):
    status = {
        "observedGeneration": observed,
        "stableRevision": stable,
        "updateRevision": update,
        "conditions": [
            {"type": api.COND_READY, "status": ready, "reason": "Serving" if ready == "True" else "Waiting"},
            {"type": api.COND_RECONCILING, "status": reconciling, "reason": "Rolling"},
            {"type": api.COND_STALLED, "status": stalled, "reason": "BadImage", "message": "image not found"},
        ],
    }
    if release:
        status["release"] = release
    return {"metadata": {"namespace": "team", "name": "bot", "generation": generation}, "status": status}


@pytest.mark.parametrize(
    ("body", "state", "why"),
    [
        pytest.param(cbs(), "done", "revision r2 is stable and Ready", id="done"),
        pytest.param(cbs(observed=1), "progressing", "generation 1", id="old-generation"),
        pytest.param(
            cbs(stable="r1", release={"phase": "Progressing", "revision": "r2", "traffic": 20}),
            "progressing",
            "Progressing, traffic 20",
            id="release-running",
        ),
        pytest.param(cbs(ready="False"), "progressing", "not Ready", id="not-ready"),
        pytest.param(cbs(reconciling="True"), "progressing", "Reconciling", id="reconciling"),
        pytest.param(cbs(stable="r1"), "progressing", "stable r1, spec r2", id="not-yet-stable"),
        pytest.param(cbs(stalled="True"), "failed", "Stalled: BadImage: image not found", id="stalled"),
        pytest.param(  # the operator marks it Stalled (RolledBack) too: the release's own words win
            cbs(
                stable="r1",
                stalled="True",
                release={"phase": "RolledBack", "revision": "r2", "message": "error rate 0.4"},
            ),
            "failed",
            "revision r2 was rolled back: error rate 0.4",
            id="rolled-back",
        ),
        pytest.param(  # an older revision's rollback is history: the spec's own release decides
            cbs(release={"phase": "RolledBack", "revision": "r1"}),
            "done",
            "stable and Ready",
            id="old-rollback",
        ),
    ],
)
def test_rollout_outcome(body, state, why):
    got, message = plugin.rollout_outcome(body)
    assert got == state and why in message, (got, message)


class Reads:
    """The object as successive reads see it, on a clock that moves only when the loop sleeps."""

    def __init__(self, monkeypatch, bodies):
        self.bodies, self.now, self.reads = list(bodies), 0.0, 0
        monkeypatch.setattr(plugin, "get_service", self.get)
        monkeypatch.setattr(
            plugin, "show_status", lambda ns, name, body, output: body["status"].get("stableRevision")
        )

    def get(self, ns, name):
        self.reads += 1
        return self.bodies[min(self.reads, len(self.bodies)) - 1]

    def sleep(self, seconds):
        self.now += seconds


@pytest.mark.parametrize(
    ("bodies", "code", "said"),
    [
        pytest.param([cbs(stable="r1"), cbs(stable="r1"), cbs()], plugin.DONE, "rolled out", id="done"),
        pytest.param([cbs(stable="r1"), cbs(stalled="True")], plugin.FAILED, "failed: Stalled", id="failed"),
        pytest.param([cbs(stable="r1")], plugin.TIMED_OUT, "still progressing after 10s", id="timed-out"),
    ],
)
def test_status_timeout_exits_with_the_outcome(monkeypatch, capsys, bodies, code, said):
    reads = Reads(monkeypatch, bodies)
    assert (
        plugin.follow("team", "bot", "tree", False, 10, 2, clock=lambda: reads.now, sleep=reads.sleep) == code
    )
    out = capsys.readouterr()
    assert said in out.out + out.err
    assert reads.now <= 10  # never waits past the timeout


def test_watch_prints_only_changes(monkeypatch, capsys):
    reads = Reads(monkeypatch, [cbs(stable="r1"), cbs(stable="r1"), cbs(stable="r1"), cbs()])
    assert (
        plugin.follow("team", "bot", "tree", True, 60, 2, clock=lambda: reads.now, sleep=reads.sleep)
        == plugin.DONE
    )
    shown = [line for line in capsys.readouterr().out.splitlines() if line in ("r1", "r2")]
    assert shown == ["r1", "r2"]  # three reads of r1, printed once


def test_get_all_namespaces_lists_every_namespace(monkeypatch, capsys):
    asked = []

    def request(method, path, **kw):
        asked.append(path)
        return {"items": [cbs(), {**cbs(), "metadata": {"namespace": "other", "name": "faq"}}]}

    monkeypatch.setattr(kube, "request", request)
    monkeypatch.setattr(plugin, "current_namespace", lambda context=None: "team")
    assert plugin.main(["get", "-A"]) == 0
    assert asked == [kube.object_path(api.KIND, None)] and "/namespaces/" not in asked[0]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["team", "bot"] and lines[1].split()[:2] == ["other", "faq"]


@pytest.mark.parametrize(
    "error, said",
    [
        pytest.param(
            kube.UNREACHABLE[0]("Invalid kube-config file. No configuration found."),
            "error: no cluster configured (KUBECONFIG, ~/.kube/config, --kubeconfig, --context): Invalid kube-config",
            id="no-kubeconfig",
        ),
        pytest.param(
            urllib3.exceptions.MaxRetryError(
                None,
                "/apis",
                urllib3.exceptions.NewConnectionError(
                    None,
                    "HTTPSConnection(host='127.0.0.1', port=1): Failed to establish a new connection: "
                    "[Errno 111] Connection refused",
                ),
            ),
            "error: no answer from the API server: Failed to establish a new connection",
            id="refused",
        ),
        pytest.param(
            api.ApiError(403, "Forbidden", '{"message": "chatbotservices is forbidden"}'),
            "error: 403 Forbidden: chatbotservices is forbidden",
            id="forbidden",
        ),
    ],
)
def test_no_cluster_is_one_line_and_exit_1(monkeypatch, capsys, error, said):
    """No kubeconfig, no answer, or a refusal: one line on stderr, exit 1, no traceback."""

    def request(method, path, **kw):
        raise error

    monkeypatch.setattr(kube, "request", request)
    monkeypatch.setattr(plugin, "current_namespace", lambda context=None: "team")
    assert plugin.main(["get"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err
    if "no answer" in said:
        assert err.rstrip().endswith(": [Errno 111] Connection refused"), err


def test_a_namespaced_path_needs_a_namespace_for_a_name():
    with pytest.raises(ValueError, match="needs a namespace"):
        kube.object_path(api.KIND, None, "bot")


def test_context_picks_the_kubeconfigs_context_and_its_namespace(monkeypatch, tmp_path, capsys):
    config = tmp_path / "config"
    config.write_text(
        "current-context: a\ncontexts:\n- name: a\n  context: {namespace: ns-a}\n- name: b\n  context: {namespace: ns-b}\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    configured, asked = [], []
    monkeypatch.setattr(kube, "configure", lambda kubeconfig=None, context=None: configured.append(context))
    monkeypatch.setattr(kube, "request", lambda method, path, **kw: asked.append(path) or {"items": []})
    assert plugin.main(["get", "--context", "b"]) == 0
    assert configured == ["b"] and asked == [kube.object_path(api.KIND, "ns-b")]


def test_retry_writes_a_new_token_and_clears_the_abort_that_rolled_the_release_back(monkeypatch, capsys):
    patched = []
    monkeypatch.setattr(plugin, "patch_rollout", lambda ns, name, fields: patched.append((ns, name, fields)))
    body = cbs(release={"revision": "r3", "phase": "RolledBack"})
    body["spec"] = {"rollout": {"abort": "r3"}}
    now = datetime(2026, 11, 28, 11, 0, tzinfo=UTC)
    assert plugin.retry("team", "bot", body, now) == 0
    assert patched == [("team", "bot", {"retry": "2026-11-28T11:00:00Z", "abort": None})]
    assert "retry of revision r3 requested" in capsys.readouterr().out
    # an abort naming another revision is left as it is
    body["spec"] = {"rollout": {"abort": "r9"}}
    plugin.retry("team", "bot", body, now)
    assert patched[-1][2] == {"retry": "2026-11-28T11:00:00Z"}


@pytest.mark.parametrize("release", [None, {"revision": "r3", "phase": "Progressing"}])
def test_retry_refuses_without_a_rolled_back_release(monkeypatch, capsys, release):
    monkeypatch.setattr(plugin, "patch_rollout", lambda *a: pytest.fail("nothing to retry, nothing patched"))
    assert plugin.retry("team", "bot", cbs(release=release)) == 1
    assert "no rolled-back release to retry on team/bot" in capsys.readouterr().err
