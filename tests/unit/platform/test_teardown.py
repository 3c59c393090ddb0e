"""sigint_deferred: a SIGINT inside the block waits for its end (the cluster fixtures' teardown).

Test design: a real process sends itself SIGINT inside the block, then finishes the block; it must print
the block's last line, then be interrupted. Without the deferral the interrupt lands mid-block."""

from __future__ import annotations

import subprocess
import sys

import pytest
from chatfleet_platform.common.config import REPO_ROOT

pytestmark = pytest.mark.harness

SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from teardown import sigint_deferred
try:
    with sigint_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        print("teardown finished", flush=True)
except KeyboardInterrupt:
    print("interrupted after", flush=True)
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
"""


def test_a_sigint_inside_the_block_interrupts_once_the_block_is_done():
    script = SCRIPT.format(tests=str(REPO_ROOT / "tests"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["teardown finished", "interrupted after"]


def test_without_a_sigint_the_block_just_runs():
    script = SCRIPT.format(tests=str(REPO_ROOT / "tests")).replace(
        "os.kill(os.getpid(), signal.SIGINT)", "pass"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["teardown finished"], done.stderr
