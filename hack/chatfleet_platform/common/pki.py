"""A throwaway certificate authority, serving and client certificates, and the kubeconfig."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_IP = "10.96.0.1"  # first address of cluster.SERVICE_CIDR: the kubernetes Service
API_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)] if org else []
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject, public_key, issuer, issuer_key, *, ca=False, usage=None, sans=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=not ca,
                key_cert_sign=ca,
                crl_sign=ca,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca_and_leaf(paths: tuple[Path, Path, Path], ca_cn: str, cn: str, usage: list, sans=None) -> None:
    """A fresh CA and one certificate it signs, written to paths (ca.crt, leaf.crt, leaf.key)."""
    ca_key = _key()
    ca_name = _name(ca_cn)
    ca = _cert(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True)
    key = _key()
    cert = _cert(_name(cn), key.public_key(), ca_name, ca_key, usage=usage, sans=sans)
    _write_cert(paths[0], ca)
    _write_cert(paths[1], cert)
    _write_key(paths[2], key)


def generate(pki_dir: Path) -> None:
    """Write ca, apiserver, admin, service-account and front-proxy key material into pki_dir (idempotent)."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    if not (pki_dir / "admin.crt").exists():
        _generate_core(pki_dir)
    front_proxy(pki_dir)


def front_proxy(pki_dir: Path) -> tuple[Path, Path, Path]:
    """The aggregation layer's identity: its own CA and the `front-proxy-client` certificate (idempotent).

    The API server presents this certificate when it proxies a request to an aggregated API server (a
    metrics adapter behind an APIService); the adapter trusts the CA for the X-Remote-User headers.
    Returns (front-proxy-ca.crt, front-proxy-client.crt, front-proxy-client.key).
    """
    paths = (
        pki_dir / "front-proxy-ca.crt",
        pki_dir / "front-proxy-client.crt",
        pki_dir / "front-proxy-client.key",
    )
    if all(path.exists() for path in paths):
        return paths
    _ca_and_leaf(paths, "chatfleet-front-proxy-ca", "front-proxy-client", [ExtendedKeyUsageOID.CLIENT_AUTH])
    return paths


def _generate_core(pki_dir: Path) -> None:
    """The cluster CA, the API server's serving pair, the admin client and the service-account keys."""
    ca_key = _key()
    ca_name = _name("chatfleet-local-ca")
    ca = _cert(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True)
    _write_key(pki_dir / "ca.key", ca_key)
    _write_cert(pki_dir / "ca.crt", ca)

    srv_key = _key()
    sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", SERVICE_IP)]
    sans += [x509.DNSName(n) for n in API_DNS_NAMES]
    srv = _cert(
        _name("kube-apiserver"),
        srv_key.public_key(),
        ca_name,
        ca_key,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    _write_key(pki_dir / "apiserver.key", srv_key)
    _write_cert(pki_dir / "apiserver.crt", srv)

    adm_key = _key()
    adm = _cert(
        _name("kubernetes-admin", "system:masters"),
        adm_key.public_key(),
        ca_name,
        ca_key,
        usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    _write_key(pki_dir / "admin.key", adm_key)
    _write_cert(pki_dir / "admin.crt", adm)

    sa_key = _key()
    _write_key(pki_dir / "sa.key", sa_key)
    (pki_dir / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def client_identity(pki_dir: Path, name: str, cn: str, org: str | None = None) -> tuple[Path, Path]:
    """A client certificate and key `<name>.crt/.key` for CN/O, signed by the CA in pki_dir (idempotent)."""
    crt, key_path = pki_dir / f"{name}.crt", pki_dir / f"{name}.key"
    if crt.exists() and key_path.exists():
        return crt, key_path
    ca = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    key = _key()
    cert = _cert(
        _name(cn, org), key.public_key(), ca.subject, ca_key, usage=[ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    _write_key(key_path, key)
    _write_cert(crt, cert)
    return crt, key_path


def kubeconfig(server: str, pki_dir: Path, namespace: str = "default", *, user: str = "admin") -> str:
    """A kubeconfig (YAML text) for an identity of pki_dir (`admin` by default) against server."""
    return (
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: chatfleet-local\n  cluster:\n"
        f"    server: {server}\n    certificate-authority: {pki_dir / 'ca.crt'}\n"
        "users:\n- name: chatfleet-admin\n  user:\n"
        f"    client-certificate: {pki_dir / (user + '.crt')}\n    client-key: {pki_dir / (user + '.key')}\n"
        "contexts:\n- name: chatfleet-local\n  context:\n"
        f"    cluster: chatfleet-local\n    user: chatfleet-admin\n    namespace: {namespace}\n"
        "current-context: chatfleet-local\n"
    )


def serving_pair(
    pki_dir: Path, name: str, *, dns: tuple[str, ...] = (), client_auth: bool = False
) -> tuple[Path, Path, Path]:
    """A fresh CA plus a server certificate for 127.0.0.1, localhost and `dns`: (ca.crt, NAME.crt, NAME.key).

    `client_auth` adds the clientAuth usage, for a certificate that both ends of a mutual-TLS link share.
    """
    pki_dir.mkdir(parents=True, exist_ok=True)
    names = dict.fromkeys(("localhost", *dns))
    sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), *(x509.DNSName(n) for n in names)]
    usage = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])
    paths = (pki_dir / "ca.crt", pki_dir / f"{name}.crt", pki_dir / f"{name}.key")
    _ca_and_leaf(paths, f"{name}-test-ca", name, usage, sans)
    return paths
