"""The operator's own limit on spec.model.hostPath: the pure check, its message, and the setting.

Test design: table tests of `host_path_allowed` (whole path segments, '..' refused), the problem it makes
(naming the field and the allowed prefixes), and the flag / environment / default of the setting. The
chart's ValidatingAdmissionPolicy must agree with the same table: tests/chart/test_chart_hostpath.py.
"""

from __future__ import annotations

import pytest
from chatfleet_operator.api import Reason
from chatfleet_operator.cli import build_settings, parse_args
from chatfleet_operator.converge.policy import host_path_allowed, host_path_prefix_error, host_path_problems
from chatfleet_operator.settings import PodSettings
from chatfleet_operator.spec import ChatbotServiceSpec

#: (path, allowed prefixes, allowed?) -- shared with the chart's admission policy test.
CASES = [
    pytest.param("/data", ("/data",), True, id="the-prefix-itself"),
    pytest.param("/data/x", ("/data",), True, id="below"),
    pytest.param("/data/x/y", ("/data",), True, id="deep-below"),
    pytest.param("/database", ("/data",), False, id="not-on-a-segment"),
    pytest.param("/dat", ("/data",), False, id="shorter"),
    pytest.param("/", ("/data",), False, id="root"),
    pytest.param("/data/../etc", ("/data",), False, id="dot-dot-escapes"),
    pytest.param("/data/..", ("/data",), False, id="dot-dot-at-end"),
    pytest.param("/data/x..y", ("/data",), True, id="dots-inside-a-name"),
    pytest.param("/srv/m", ("/data", "/srv"), True, id="second-prefix"),
    pytest.param("/anything/at/all", ("/",), True, id="root-prefix-allows-all"),
    pytest.param("/../etc", ("/",), False, id="root-prefix-still-no-dot-dot"),
    pytest.param("/data", (), False, id="none-allowed"),
]


@pytest.mark.parametrize(("path", "allowed", "ok"), CASES)
def test_host_path_allowed(path: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert host_path_allowed(path, allowed) is ok


def spec(path: str | None) -> ChatbotServiceSpec:
    """A spec whose weights come from a host path (or a URI when None)."""
    return ChatbotServiceSpec.from_dict({"model": {"hostPath": path} if path else {"uri": "hf://a/b"}})


class TestProblem:
    def test_no_host_path_no_problem(self) -> None:
        assert host_path_problems(spec(None), PodSettings(allowed_host_paths=())) == []

    def test_allowed_no_problem(self) -> None:
        assert host_path_problems(spec("/data/m"), PodSettings(allowed_host_paths=("/data",))) == []

    def test_outside_names_the_field_and_the_prefixes(self) -> None:
        (problem,) = host_path_problems(spec("/etc"), PodSettings(allowed_host_paths=("/data", "/srv")))
        assert problem.reason == Reason.HOST_PATH_NOT_ALLOWED
        assert "spec.model.hostPath '/etc'" in problem.message
        assert "(/data, /srv)" in problem.message and "--allowed-host-path" in problem.message

    def test_none_allowed_says_so(self) -> None:
        (problem,) = host_path_problems(spec("/data"), PodSettings(allowed_host_paths=()))
        assert "allows no host paths" in problem.message and "operator.allowedHostPaths" in problem.message


class TestSetting:
    def test_default_refuses_every_host_path(self, monkeypatch) -> None:
        monkeypatch.delenv("CHATFLEET_ALLOWED_HOST_PATHS", raising=False)
        assert PodSettings().allowed_host_paths == ()
        assert build_settings(parse_args(["run"])).pod.allowed_host_paths == ()

    def test_flag_wins_over_env(self, monkeypatch) -> None:
        monkeypatch.setenv("CHATFLEET_ALLOWED_HOST_PATHS", "/a, /b")
        assert build_settings(parse_args(["run"])).pod.allowed_host_paths == ("/a", "/b")
        flags = ["run", "--allowed-host-path=/models", "--allowed-host-path=/srv/weights"]
        assert build_settings(parse_args(flags)).pod.allowed_host_paths == ("/models", "/srv/weights")

    @pytest.mark.parametrize(
        ("prefix", "why"),
        [
            pytest.param("models", "must be an absolute path", id="relative"),
            pytest.param("/models/../etc", "must have no '..' segment", id="dot-dot"),
        ],
    )
    def test_a_bad_prefix_stops_the_operator_with_a_clear_message(self, prefix: str, why: str) -> None:
        assert why in (host_path_prefix_error(prefix) or "")
        with pytest.raises(SystemExit, match="--allowed-host-path"):
            build_settings(parse_args(["run", f"--allowed-host-path={prefix}"]))
