"""A throwaway PKI for the TLS tests, made with `cryptography`: a CA, a server certificate
for 127.0.0.1 and localhost, a client certificate from the same CA, and a client
certificate from another CA (which servers must refuse) and that CA. EC P-256 keys: quick
to make."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAMES = ("localhost", "attnstore.internal")


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate every server and client trusts
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate signed by another CA
    rogue_key: Path
    rogue_ca: Path  # that other CA, which signed no server certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    extensions: list[x509.ExtensionType],
) -> x509.Certificate:
    """A certificate for `key`, signed by `issuer` (None: self-signed, a CA)."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signing_key = (issuer[0].subject, issuer[1]) if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=isinstance(extension, x509.BasicConstraints))
    return builder.sign(signing_key, hashes.SHA256())


def _new_ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    return _issue(name, key, None, [x509.BasicConstraints(ca=True, path_length=0)]), key


def _leaf(
    name: str, ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], usage: x509.ObjectIdentifier
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVER_NAMES]
    alt_names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    extensions = [
        x509.BasicConstraints(ca=False, path_length=None),
        x509.SubjectAlternativeName(alt_names),
        x509.ExtendedKeyUsage([usage]),
    ]
    return _issue(name, key, ca, extensions), key


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def write_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, rogue_ca = _new_ca("attnstore test CA"), _new_ca("some other CA")
    ca_path, _ = _write(directory, "ca", *ca)
    server = _write(directory, "server", *_leaf("attnstore server", ca, ExtendedKeyUsageOID.SERVER_AUTH))
    client = _write(directory, "client", *_leaf("attnstore client", ca, ExtendedKeyUsageOID.CLIENT_AUTH))
    rogue = _write(directory, "rogue", *_leaf("rogue client", rogue_ca, ExtendedKeyUsageOID.CLIENT_AUTH))
    rogue_ca_path, _ = _write(directory, "rogue-ca", *rogue_ca)
    return Pki(ca_path, *server, *client, *rogue, rogue_ca_path)
