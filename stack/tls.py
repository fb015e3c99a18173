"""The local stack's CA and the certificates it signs for Kafka's SASL_SSL listener and Postgres, made by trustme.

    python stack/tls.py <folder>

Writes, into a folder only its owner can read: ca.pem (what clients trust), postgres.pem and postgres.key,
and broker.p12 (the broker's key and certificate chain as a PKCS#12 key store). Every certificate names
127.0.0.1 and localhost, the only addresses the stack's services listen on. The key store's password comes
from the environment (KL_KAFKA_KEYSTORE_PASSWORD), never a command line. Files that exist are kept: the
services hold them while they run, so a second call changes nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

HOSTS = ("127.0.0.1", "localhost")
FILES = ("ca.pem", "postgres.pem", "postgres.key", "broker.p12")


def _write(path: Path, data: bytes) -> None:
    """Write `data` readable by the owner only, atomically (a half-written key never exists under its name)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.chmod(0o600)
    partial.replace(path)


def make_tls(folder: Path, keystore_password: str) -> bool:
    """Make the CA and the certificates in `folder` unless they all exist; whether anything was made."""
    if all((folder / name).exists() for name in FILES):
        return False
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ca = trustme.CA(organization_name="kafka-ledger local stack", key_type=trustme.KeyType.RSA)
    postgres = ca.issue_cert(*HOSTS, key_type=trustme.KeyType.RSA)
    broker = ca.issue_cert(*HOSTS, key_type=trustme.KeyType.RSA)
    _write(folder / "postgres.pem", b"".join(blob.bytes() for blob in postgres.cert_chain_pems))
    _write(folder / "postgres.key", postgres.private_key_pem.bytes())
    broker_key = serialization.load_pem_private_key(broker.private_key_pem.bytes(), password=None)
    broker_cert, *chain = (x509.load_pem_x509_certificate(blob.bytes()) for blob in broker.cert_chain_pems)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    _write(folder / "broker.p12", pkcs12.serialize_key_and_certificates(
        b"broker", broker_key, broker_cert, [*chain, ca_cert],
        serialization.BestAvailableEncryption(keystore_password.encode())))
    # The CA last: its presence is what says the folder is complete.
    _write(folder / "ca.pem", ca.cert_pem.bytes())
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    password = os.environ.get("KL_KAFKA_KEYSTORE_PASSWORD")
    if not password:
        print("stack/tls.py: KL_KAFKA_KEYSTORE_PASSWORD is not set (scripts/env.sh sets it)", file=sys.stderr)
        return 2
    made = make_tls(Path(argv[1]), password)
    print(f"tls: {'made' if made else 'kept'} the local CA and the certificates of Kafka and Postgres in {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
