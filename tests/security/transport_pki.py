"""A throw-away PKI for the transport tests: one CA, a server certificate for loopback and
client certificates with a chosen subject CN and subjectAltName (``openssl`` CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path, clients: dict[str, tuple[str, str]]) -> dict[str, Path]:
    """``ca.pem``, ``server.pem``/``server.key`` (``IP:127.0.0.1,DNS:localhost``) and, per
    ``clients`` entry ``name: (CN, subjectAltName)``, ``name.pem``/``name.key`` under ``d``;
    returns ``{file name: path}``."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ca",
             "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    out = {"ca.pem": d / "ca.pem"}
    for name, (cn, san) in {"server": ("server", "IP:127.0.0.1,DNS:localhost"),
                            **clients}.items():
        ext = d / f"{name}.cnf"
        ext.write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
                 "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                 "-extfile", str(ext), "-out", str(d / f"{name}.pem"))
        out[f"{name}.pem"] = d / f"{name}.pem"
        out[f"{name}.key"] = d / f"{name}.key"
    return out
