"""A throw-away certificate authority for local runs and tests: a CA, a server certificate for loopback, and a
client certificate for mTLS, written as PEM files (keys readable by the owner only).

Not for production: the CA key sits beside the certificates and nothing rotates them. Needs `cryptography`
(in the `embedded` and `dev` extras).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


@dataclass(frozen=True, slots=True)
class DevCerts:
    """Paths of the PEM files `write_dev_certs` made."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sieve local run"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(path, 0o600)


def _issue(
    subject: str,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    usage: list[x509.ObjectIdentifier],
    hosts: list[str],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def write_dev_certs(folder: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")) -> DevCerts:
    """Makes a fresh CA and, signed by it, a server certificate for `hosts` and a client certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("Sieve local CA", _name("Sieve local CA"), ca_key, ca_key, ca=True, usage=[], hosts=[])
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue(
        "sieve-server",
        ca_cert.subject,
        ca_key,
        server_key,
        ca=False,
        usage=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        hosts=list(hosts),
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _issue(
        "sieve-client", ca_cert.subject, ca_key, client_key, ca=False, usage=[ExtendedKeyUsageOID.CLIENT_AUTH], hosts=[]
    )
    certs = DevCerts(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server-key.pem",
        folder / "client.pem",
        folder / "client-key.pem",
    )
    certs.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(certs.server_key, server_key)
    certs.client_cert.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(certs.client_key, client_key)
    return certs


__all__ = ["DevCerts", "write_dev_certs"]
