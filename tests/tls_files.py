"""TLS material for tests: an authority of their own and a certificate it signed for
127.0.0.1 and localhost, as PEM files."""

from __future__ import annotations

from pathlib import Path

import trustme

from shuffle_runtime.tls import TlsFiles

__all__ = ["write_tls_files"]


def write_tls_files(directory: Path) -> TlsFiles:
    """A new authority's certificate and a server certificate with its key, under
    ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = (directory / name for name in ("cert.pem", "key.pem", "ca.pem"))
    cert_file.write_bytes(b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key_file))
    authority.cert_pem.write_to_path(str(ca_file))
    return TlsFiles(cert_file=str(cert_file), key_file=str(key_file), ca_file=str(ca_file))
