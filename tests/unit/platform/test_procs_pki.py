"""Process bookkeeping, ports and PKI of the local platform."""

import os
import subprocess
import sys

import pytest
import yaml
from chatfleet_platform.common import pki, procs
from cryptography import x509

pytestmark = pytest.mark.harness  # the simulated platform, not the product


class TestProcs:
    def test_free_port_prefers_the_asked_port_when_free(self):
        port = procs.free_port()
        assert procs.free_port(port) == port

    def test_free_port_moves_on_when_taken(self):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            taken = s.getsockname()[1]
            assert procs.port_in_use(taken)
            assert procs.free_port(taken) != taken

    def test_free_port_is_never_one_the_kernel_gives_outgoing_connections(self, tmp_path):
        """A port picked before its server listens must not be in the ephemeral range: any outgoing
        connection may take one of those in between (a kube-controller-manager failed so)."""
        low, _ = procs.ephemeral_range()
        picked = [procs.free_port() for _ in range(50)]
        assert len(set(picked)) == len(picked)  # never the same port twice from one process
        assert all(procs.LOWEST_PORT <= p <= procs.HIGHEST_PORT and p < low for p in picked), sorted(picked)
        ranged = tmp_path / "range"
        ranged.write_text("25000\t60999\n")
        assert procs.ephemeral_range(ranged) == (25000, 60999)
        assert all(20000 <= procs.free_port(ephemeral=(25000, 60999)) < 25000 for _ in range(20))
        # a range that leaves no room below it: the kernel picks
        assert procs.free_port(ephemeral=(20500, 60999)) > 0

    def test_never_stops_a_process_that_is_not_ours(self):
        # same PID, other start time: a recycled PID must never be signalled
        me = procs.Proc(os.getpid(), procs.start_time(os.getpid()) + 1)
        assert not procs.is_ours(me)
        assert not procs.stop(me)

    def test_starts_and_stops_its_own_process(self, tmp_path):
        proc = procs.start(
            "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], log=tmp_path / "l"
        )
        assert procs.is_ours(proc)
        assert procs.Proc.from_json(proc.to_json()) == proc
        assert procs.stop(proc)
        assert not procs.is_ours(proc)

    def test_a_wait_that_times_out_says_what_it_waited_on(self):
        from chatfleet_platform.common.config import PlatformError

        with pytest.raises(PlatformError, match=r"the route: not ready after 0s \(status: pending\)$"):
            procs.wait_for("the route", lambda: False, timeout=0.01, detail=lambda: "(status: pending)")

    def test_dead_process_is_not_ours(self, tmp_path):
        proc = procs.start("quick", [sys.executable, "-c", "pass"], log=tmp_path / "l")
        subprocess.run(["sleep", "0.3"])
        assert not procs.is_ours(proc)


class TestPKI:
    def test_generates_a_ca_signed_serving_cert_with_loopback_sans(self, tmp_path):
        pki.generate(tmp_path)
        ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
        srv = x509.load_pem_x509_certificate((tmp_path / "apiserver.crt").read_bytes())
        srv.verify_directly_issued_by(ca)
        sans = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
        adm = x509.load_pem_x509_certificate((tmp_path / "admin.crt").read_bytes())
        assert "O=system:masters" in adm.subject.rfc4514_string()
        assert oct((tmp_path / "admin.key").stat().st_mode)[-3:] == "600"

    def test_generate_is_idempotent(self, tmp_path):
        pki.generate(tmp_path)
        before = (tmp_path / "ca.crt").read_bytes()
        pki.generate(tmp_path)
        assert (tmp_path / "ca.crt").read_bytes() == before

    def test_kubeconfig_points_at_the_local_server(self, tmp_path):
        cfg = yaml.safe_load(pki.kubeconfig("https://127.0.0.1:1234", tmp_path))
        assert cfg["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1234"
        assert cfg["current-context"] == "chatfleet-local"
