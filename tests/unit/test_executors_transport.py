"""The pinned HTTP transport (``kairos.executors.egress.post``) against real local servers (``tests.support.peer``).

Only loopback addresses are ever connected to. Host names such as ``api.example.test`` reach the local
server through an injected resolver; that they are never resolved again proves the connection goes to
the checked address (the DNS-rebinding defence).
"""

from __future__ import annotations

import datetime
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kairos.executors import egress
from kairos.executors.base import ExecutorError
from tests.support.peer import Peer, closed_port, drop, hang, partial_then_hang, resolver_to, respond

# --- tests of egress.post ------------------------------------------------------------------------


def test_post_connects_to_the_checked_address_and_never_resolves_the_name_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Peer(respond(200, "ok", "text/plain")) as peer:
        calls: list[str] = []
        target = egress.check(peer.url("/hook?x=1", host="api.example.test"), allow=["127.0.0.1"],
                              resolve=resolver_to("127.0.0.1", calls))
        looked_up: list[str] = []
        real = socket.getaddrinfo

        def spy(host: Any, *args: Any, **kwargs: Any) -> Any:
            looked_up.append(str(host))
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", spy)

        answer = egress.post(target, body=b"{}", headers={"X-Test": "1"}, timeout=5, read_limit=1024)

    assert answer == egress.Answer(status=200, body=b"ok", overflow=False)
    assert calls == ["api.example.test"]  # resolved once, by the check
    assert "api.example.test" not in looked_up  # the connection used the pinned IP
    (got,) = peer.received
    assert got.path == "/hook?x=1"
    assert got.headers["host"] == f"api.example.test:{peer.port}"
    assert got.headers["x-test"] == "1"


def test_post_tries_the_next_checked_address_only_when_connecting_failed() -> None:
    with Peer(respond(200, "ok")) as peer:
        # 127.0.0.2 is loopback too, but the server listens on 127.0.0.1 only: refused, nothing sent.
        target = egress.ResolvedTarget(url=peer.url(), scheme="http", host="api.example.test", port=peer.port,
                                       path="/v1", addresses=("127.0.0.2", "127.0.0.1"))
        answer = egress.post(target, body=b"{}", headers={}, timeout=5, read_limit=1024)
    assert answer.status == 200
    assert len(peer.received) == 1


def test_post_refuses_a_target_without_checked_addresses() -> None:
    target = egress.ResolvedTarget(url="http://x.test/", scheme="http", host="x.test", port=80, path="/",
                                   addresses=())
    with pytest.raises(ExecutorError) as info:
        egress.post(target, body=b"", headers={}, timeout=1, read_limit=10)
    assert info.value.reason_code == "egress_refused"


def test_post_stops_reading_at_the_limit() -> None:
    with Peer(respond(200, b"x" * 5000)) as peer:
        target = egress.check(peer.url(), allow=["127.0.0.1"])
        answer = egress.post(target, body=b"{}", headers={}, timeout=5, read_limit=1000)
    assert answer.overflow is True
    assert answer.body == b"x" * 1000


def test_post_reports_stages() -> None:
    refused = egress.check(f"http://127.0.0.1:{closed_port()}/", allow=["127.0.0.1"])
    with pytest.raises(egress.TransportFailure) as info:
        egress.post(refused, body=b"{}", headers={}, timeout=2, read_limit=10)
    assert info.value.stage == "connect"

    with Peer(drop) as peer:
        with pytest.raises(egress.TransportFailure) as info:
            egress.post(egress.check(peer.url(), allow=["127.0.0.1"]), body=b"{}", headers={}, timeout=5,
                        read_limit=10)
    assert info.value.stage == "dropped" and info.value.status is None

    with Peer(hang) as peer:
        with pytest.raises(egress.TransportFailure) as info:
            egress.post(egress.check(peer.url(), allow=["127.0.0.1"]), body=b"{}", headers={}, timeout=0.2,
                        read_limit=10)
        peer.release.set()
    assert info.value.stage == "timeout"
    assert len(peer.received) == 1  # the request did arrive: that is why a timeout's outcome is unknown

    with Peer(partial_then_hang) as peer:
        with pytest.raises(egress.TransportFailure) as info:
            egress.post(egress.check(peer.url(), allow=["127.0.0.1"]), body=b"{}", headers={}, timeout=0.2,
                        read_limit=1000)
        peer.release.set()
    assert (info.value.stage, info.value.status, info.value.partial) == ("timeout", 200, b"first part")


# --- TLS: SNI and certificate check use the original host while the socket goes to the pinned IP --


def _certificate(tmp_path: Path, name: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_server_for() -> Iterator[Callable[[Path, Path, list[str]], ssl.SSLContext]]:
    def build(cert: Path, key: Path, sni_seen: list[str]) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)

        def record(sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
            sni_seen.append(str(name))

        context.sni_callback = record
        return context

    yield build


def test_https_uses_the_original_host_for_sni_and_certificate(
    tmp_path: Path, tls_server_for: Callable[[Path, Path, list[str]], ssl.SSLContext]
) -> None:
    cert, key = _certificate(tmp_path, "api.example.test")
    sni: list[str] = []
    with Peer(respond(200, "secure"), tls=tls_server_for(cert, key, sni)) as peer:
        target = egress.check(peer.url(host="api.example.test", scheme="https"), allow=["127.0.0.1"],
                              resolve=resolver_to("127.0.0.1"))
        answer = egress.post(target, body=b"{}", headers={}, timeout=5, read_limit=100, ca_certs=str(cert))
    assert answer.body == b"secure"
    assert sni == ["api.example.test"]
    assert peer.received[0].headers["host"] == f"api.example.test:{peer.port}"


def test_https_verifies_certificates_by_default(
    tmp_path: Path, tls_server_for: Callable[[Path, Path, list[str]], ssl.SSLContext]
) -> None:
    cert, key = _certificate(tmp_path, "api.example.test")
    with Peer(respond(200, "secure"), tls=tls_server_for(cert, key, [])) as peer:
        target = egress.check(peer.url(host="api.example.test", scheme="https"), allow=["127.0.0.1"],
                              resolve=resolver_to("127.0.0.1"))
        with pytest.raises(egress.TransportFailure) as info:
            egress.post(target, body=b"{}", headers={}, timeout=5, read_limit=100)  # self-signed: not trusted
    assert info.value.stage == "connect"
    assert peer.received == []


def test_https_refuses_a_certificate_for_another_name_before_sending(
    tmp_path: Path, tls_server_for: Callable[[Path, Path, list[str]], ssl.SSLContext]
) -> None:
    cert, key = _certificate(tmp_path, "other.example.test")
    with Peer(respond(200, "secure"), tls=tls_server_for(cert, key, [])) as peer:
        target = egress.check(peer.url(host="api.example.test", scheme="https"), allow=["127.0.0.1"],
                              resolve=resolver_to("127.0.0.1"))
        with pytest.raises(egress.TransportFailure) as info:
            egress.post(target, body=b"{}", headers={}, timeout=5, read_limit=100, ca_certs=str(cert))
    assert info.value.stage == "connect"
    assert peer.received == []
