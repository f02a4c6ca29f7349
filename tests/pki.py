"""Test certificates, made with ``cryptography``: a self-signed CA, a server certificate
for 127.0.0.1 / ::1 / localhost signed by it (also good as a client certificate, as the
controller presents its own to workers that ask), and a client certificate. Also used by
``experiments/bench_security.py``."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Pki:
    ca: str  # PEM paths
    cert: str
    key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed none of these


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _ca(name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=60))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, name: str, server: bool,
          valid: tuple[datetime.timedelta, datetime.timedelta] | None = None):
    """``valid``: from and until when, from now (by default from 5 minutes ago for 30
    days: a certificate that ends within a week is warned of)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    since, until = valid or (-datetime.timedelta(minutes=5), datetime.timedelta(days=30))
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
         .issuer_name(ca_cert.subject).public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now + since)
         .not_valid_after(now + until)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage(
             [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server
             else [ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
             ca_key.public_key()), critical=False))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


def make_pki(folder: str | Path) -> Pki:
    """Write the PEM files into ``folder`` (keys 0600) and return their paths."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca("clockwork test CA")
    _, other = _ca("some other CA")
    skey, scert = _leaf(ca_key, ca, "127.0.0.1", server=True)
    ckey, ccert = _leaf(ca_key, ca, "clockwork test client", server=False)

    def put(name: str, data: bytes, private: bool = False) -> str:
        p = d / name
        p.write_bytes(data)
        if private:
            p.chmod(0o600)
        return str(p)

    return Pki(ca=put("ca.pem", _pem_cert(ca)), cert=put("server.pem", _pem_cert(scert)),
               key=put("server-key.pem", _pem_key(skey), True),
               client_cert=put("client.pem", _pem_cert(ccert)),
               client_key=put("client-key.pem", _pem_key(ckey), True),
               other_ca=put("other-ca.pem", _pem_cert(other)))


def dated_server_cert(folder: str | Path, since: datetime.timedelta,
                      until: datetime.timedelta) -> tuple[str, str]:
    """A server certificate (signed by a CA of its own) valid from ``since`` until
    ``until`` from now, and its key: PEM paths in ``folder``."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca("clockwork test CA")
    key, cert = _leaf(ca_key, ca, "127.0.0.1", server=True, valid=(since, until))
    (d / "dated.pem").write_bytes(_pem_cert(cert) + _pem_cert(ca))
    (d / "dated-key.pem").write_bytes(_pem_key(key))
    (d / "dated-key.pem").chmod(0o600)
    return str(d / "dated.pem"), str(d / "dated-key.pem")
