"""The operator's settings from its environment: read when the CLI builds them, never at import time.

Every CHATFLEET_* variable the operator reads is listed once (settings.ENVIRONMENT); these tests check
that each one reaches its field, that flags still win, that the dataclasses themselves ignore the
environment, and that a value that cannot be read exits naming its variable.
"""

from __future__ import annotations

import dataclasses

import pytest
from chatfleet_operator.cli import build_settings, parse_args
from chatfleet_operator.settings import ENVIRONMENT, PodSettings, Settings, settings_from_env

#: A readable, non-default value for each variable, and what its field then holds.
VALUES = {
    "CHATFLEET_CHAT_API_CPU": ("250m", "250m"),
    "CHATFLEET_CHAT_API_MEMORY": ("256Mi", "256Mi"),
    "CHATFLEET_STARTUP_SECONDS": ("900", 900),
    "CHATFLEET_ALLOWED_HOST_PATHS": ("/a, /b", ("/a", "/b")),
    "CHATFLEET_PROGRESS_STATUS_SECONDS": ("0", 0.0),
    "CHATFLEET_FIRST_STATUS_SECONDS": ("30", 30.0),
    "CHATFLEET_WORKERS": ("3", 3),
    "CHATFLEET_UPGRADE_WAVE": ("2", 2),
    "CHATFLEET_RUNTIME_IMAGE": ("r/rt:9", "r/rt:9"),
    "CHATFLEET_PROMETHEUS_ADDRESS": ("https://p:1", "https://p:1"),
    "CHATFLEET_GATEWAY": ("edge", "edge"),
    "CHATFLEET_GATEWAY_NAMESPACE": ("infra", "infra"),
    "CHATFLEET_GATEWAY_MIRROR": ("TraefikService", "TraefikService"),
    "CHATFLEET_ROUTING": ("Service", "Service"),
    "CHATFLEET_PICKER_IMAGE": ("reg.example/picker:1", "reg.example/picker:1"),
    "CHATFLEET_PICKER_SERVICE_ACCOUNT": ("picker-sa", "picker-sa"),
    "CHATFLEET_PICKER_NODE_SELECTOR": ("pool=system, zone=a", (("pool", "system"), ("zone", "a"))),
    "CHATFLEET_PICKER_TOLERATIONS": (
        "dedicated=system:NoSchedule,gpu",
        (("dedicated", "system", "NoSchedule"), ("gpu", None, "")),
    ),
    "CHATFLEET_ANALYSIS_ALLOWED_HOSTS": ("10.96.0.0/12", ("10.96.0.0/12",)),
    "CHATFLEET_AUTOSCALER": ("hpa", "hpa"),
    "CHATFLEET_PROMETHEUS_CA_FILE": ("/ca.pem", "/ca.pem"),
    "CHATFLEET_PROMETHEUS_BEARER_TOKEN_FILE": ("/token", "/token"),
    "CHATFLEET_PROMETHEUS_BEARER_TOKEN_HOSTS": ("prom.example", ("prom.example",)),
    "CHATFLEET_PROMETHEUS_INSECURE_SKIP_VERIFY": ("true", True),
}


def field_of(settings: Settings, path: str):
    for part in path.split("."):
        settings = getattr(settings, part)
    return settings


def test_every_variable_is_listed_with_a_value_here():
    assert set(VALUES) == set(ENVIRONMENT)


@pytest.mark.parametrize("name", sorted(ENVIRONMENT))
def test_each_variable_reaches_its_field_and_nothing_else(name):
    path, _ = ENVIRONMENT[name]
    raw, expected = VALUES[name]
    got = settings_from_env({name: raw})
    assert field_of(got, path) == expected
    assert field_of(Settings(), path) != expected  # the value is not the default
    # every other field kept its default
    for other, (p, _) in ENVIRONMENT.items():
        if other != name:
            assert field_of(got, p) == field_of(Settings(), p), other


def test_an_empty_variable_keeps_the_default():
    assert settings_from_env({name: " " for name in ENVIRONMENT}) == Settings()


def test_the_environment_is_read_when_the_cli_builds_the_settings_not_at_import(monkeypatch):
    """The module was imported long before this test: a variable set now must still count (it did not
    when the dataclasses' defaults read os.environ at import)."""
    monkeypatch.setenv("CHATFLEET_CHAT_API_CPU", "250m")
    monkeypatch.setenv("CHATFLEET_WORKERS", "3")
    monkeypatch.setenv("CHATFLEET_GATEWAY", "edge")
    got = build_settings(parse_args(["run"]))
    assert (got.pod.chat_api_cpu, got.runtime.workers, got.release.gateway_name) == ("250m", 3, "edge")


def test_the_dataclasses_ignore_the_environment(monkeypatch):
    for name, (raw, _) in VALUES.items():
        monkeypatch.setenv(name, raw)
    assert PodSettings() == Settings().pod
    assert Settings() == Settings(**{f.name: f.default_factory() for f in dataclasses.fields(Settings)})
    assert Settings().pod.chat_api_cpu == "500m" and Settings().runtime.workers == 16


def test_flags_win_over_the_environment():
    env = {"CHATFLEET_WORKERS": "3", "CHATFLEET_GATEWAY": "edge", "CHATFLEET_RUNTIME_IMAGE": "r/rt:9"}
    got = build_settings(
        parse_args(["run", "--workers=5", "--gateway=other", "--runtime-image=r/rt:10"]), env
    )
    assert (got.runtime.workers, got.release.gateway_name, got.runtime.defaults.runtime_image) == (
        5,
        "other",
        "r/rt:10",
    )


@pytest.mark.parametrize(
    ("name", "raw", "why"),
    [
        ("CHATFLEET_WORKERS", "many", "is not a whole number"),
        ("CHATFLEET_STARTUP_SECONDS", "1.5", "is not a whole number"),
        ("CHATFLEET_STARTUP_SECONDS", "1", "is below 2"),
        ("CHATFLEET_PROGRESS_STATUS_SECONDS", "soon", "is not a number"),
        ("CHATFLEET_PICKER_NODE_SELECTOR", "pool", "'pool' is not KEY=VALUE"),
        ("CHATFLEET_PICKER_TOLERATIONS", "gpu:NoSchedul", "effect 'NoSchedul' is not one of NoSchedule"),
    ],
)
def test_an_unreadable_value_exits_naming_its_variable(name, raw, why):
    with pytest.raises(SystemExit, match=f"{name}: '{raw}' {why}"):
        build_settings(parse_args(["run"]), {name: raw})


def test_the_upgrade_wave_comes_from_the_flag_over_the_environment_and_is_never_negative():
    assert build_settings(parse_args(["run"]), {}).pod.upgrade_wave == 5
    assert build_settings(parse_args(["run"]), {"CHATFLEET_UPGRADE_WAVE": "0"}).pod.upgrade_wave == 0
    got = build_settings(parse_args(["run", "--upgrade-wave=1"]), {"CHATFLEET_UPGRADE_WAVE": "7"})
    assert got.pod.upgrade_wave == 1
    with pytest.raises(SystemExit, match=r"--upgrade-wave \(CHATFLEET_UPGRADE_WAVE\): -1 is below 0"):
        build_settings(parse_args(["run", "--upgrade-wave=-1"]), {})


def test_a_retired_variable_stops_the_start_up_naming_what_replaced_it():
    """CHATFLEET_STARTUP_FAILURE_THRESHOLD counted 10-second periods; the probes now run every 2 s, so a
    value left in a chart's extraEnv would silently shrink the budget fivefold. It is refused instead."""
    with pytest.raises(
        SystemExit, match="CHATFLEET_STARTUP_FAILURE_THRESHOLD: no longer read: set CHATFLEET_STARTUP_SECONDS"
    ):
        build_settings(parse_args(["run"]), {"CHATFLEET_STARTUP_FAILURE_THRESHOLD": "60"})


def test_the_pickers_placement_comes_from_the_flags_over_the_environment():
    env = {"CHATFLEET_PICKER_NODE_SELECTOR": "pool=gpu", "CHATFLEET_PICKER_TOLERATIONS": "gpu:NoSchedule"}
    argv = ["run", "--picker-node-selector=pool=system", "--picker-node-selector=zone=a"]
    got = build_settings(parse_args([*argv, "--picker-toleration=dedicated=system:NoExecute"]), env).release
    assert got.picker_node_selector == (("pool", "system"), ("zone", "a"))
    assert got.picker_tolerations == (("dedicated", "system", "NoExecute"),)
    got = build_settings(parse_args(["run"]), env).release
    assert (got.picker_node_selector, got.picker_tolerations) == (
        (("pool", "gpu"),),
        (("gpu", None, "NoSchedule"),),
    )


@pytest.mark.parametrize(
    ("flag", "why"),
    [
        ("--picker-node-selector=pool", "--picker-node-selector: 'pool' is not KEY=VALUE"),
        ("--picker-node-selector=bad key=x", "--picker-node-selector: 'bad key' is not a label key"),
        ("--picker-toleration=gpu:Never", "--picker-toleration: effect 'Never' is not one of NoSchedule"),
        ("--picker-toleration==x:NoSchedule", "--picker-toleration: '' is not a taint key"),
    ],
)
def test_a_placement_flag_that_cannot_be_read_exits_naming_it(flag, why):
    with pytest.raises(SystemExit, match=why):
        build_settings(parse_args(["run", flag]), {})
