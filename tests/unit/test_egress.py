"""The egress check: which addresses an executor may reach, and why a refusal says what it says.

Nothing here connects anywhere: literal addresses are checked without resolving, and host names go
through an injected resolver (except ``localhost``, which the system resolves from /etc/hosts).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kairos.executors import egress
from kairos.executors.base import ExecutorError


def resolver(*addresses: str) -> egress.Resolver:
    def resolve(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    return resolve


def no_resolution(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
    raise AssertionError(f"{host} should not have been resolved")


def refused(url: str, allow: list[str], resolve: egress.Resolver = no_resolution) -> ExecutorError:
    with pytest.raises(ExecutorError) as info:
        egress.check(url, allow=allow, resolve=resolve)
    return info.value


@pytest.mark.parametrize(
    ("url", "allow", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/", ["169.254.169.254"], "metadata"),
        ("http://169.254.169.254/", ["169.254.0.0/16", "0.0.0.0/0"], "metadata"),
        ("http://169.254.170.2/v2/credentials", ["169.254.170.2"], "credentials"),
        ("http://169.254.10.1/", ["169.254.10.1"], "link-local"),
        ("http://[fd00:ec2::254]/", ["fd00:ec2::254", "::/0"], "metadata"),
        ("http://[fe80::1]/", ["fe80::/10"], "link-local"),
        ("http://100.100.100.200/", ["100.100.100.200"], "metadata"),
        ("http://0.0.0.0:8080/", ["0.0.0.0/0"], "unspecified"),
        ("http://[::]/", ["::/0"], "unspecified"),
        # IPv6 forms that carry the metadata address inside them
        ("http://[::ffff:169.254.169.254]/", ["::/0"], "metadata"),
        ("http://[64:ff9b::a9fe:a9fe]/", ["::/0"], "metadata"),
        ("http://[::a9fe:a9fe]/", ["::/0"], "metadata"),
        ("http://[2002:a9fe:a9fe::1]/", ["::/0"], "metadata"),
        ("http://[::ffff:0:169.254.169.254]/", ["::/0"], "metadata"),  # IPv4-translated (SIIT)
        ("http://[64:ff9b:1:a9fe:a9:fe00::]/", ["::/0"], "metadata"),  # local-use NAT64, a /48 prefix
        # multicast: never an HTTP destination
        ("http://224.0.0.1/", ["0.0.0.0/0"], "multicast"),
        ("http://239.255.255.250:1900/", ["239.0.0.0/8"], "multicast"),
        ("http://[ff02::1]/", ["::/0"], "multicast"),
        ("http://[ff0e::1]/", ["ff00::/8"], "multicast"),
        ("http://[::ffff:224.0.0.251]/", ["::/0"], "multicast"),
    ],
)
def test_link_local_and_metadata_are_refused_even_when_allowed(url: str, allow: list[str], why: str) -> None:
    error = refused(url, allow)
    assert error.reason_code == "egress_refused"
    assert why in error.message and "refused always" in error.message
    assert not error.retry_safe and not error.outcome_unknown


def test_a_listed_host_name_does_not_unlock_a_metadata_address(caplog: pytest.LogCaptureFixture) -> None:
    error = refused("http://metadata.google.internal/computeMetadata/v1/", ["metadata.google.internal"],
                    resolver("169.254.169.254"))
    assert (error.reason_code, error.message) == unreachable("metadata.google.internal")
    (logged,) = [vars(r) for r in caplog.records if getattr(r, "action", None) == "egress_refused"]
    assert logged["address"] == "169.254.169.254" and "metadata" in logged["why"]  # the operator sees why


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://10.1.2.3/", "private"),
        ("http://192.168.0.10/", "private"),
        ("http://127.0.0.1:8080/", "loopback"),
        ("http://[::1]:8080/", "loopback"),
        ("http://100.64.0.1/", "not a public address"),  # carrier-grade NAT
        ("http://[::ffff:10.0.0.1]/", "private"),
        ("http://[fd12:3456::1]/", "private"),
        ("http://[fec0::1]/", "not a public address"),  # site-local
        ("http://[64:ff9b:1:a00:0:100::]/", "not a public address"),  # local-use NAT64 prefix (10.0.0.1)
        ("http://[64:ff9b:1:0808:08:0800::]/", "not a public address"),  # ... even when it carries 8.8.8.8
        ("http://[64:ff9b::a00:1]/", "private"),  # well-known NAT64 prefix carrying 10.0.0.1
        ("http://[64:ff9b::7f00:1]/", "loopback"),  # ... carrying 127.0.0.1
        ("http://[::ffff:0:10.0.0.1]/", "private"),  # IPv4-translated
        ("http://[3fff::1]/", "not a public address"),  # documentation
    ],
)
def test_non_public_addresses_are_refused_unless_allowed(url: str, kind: str) -> None:
    error = refused(url, [])
    assert error.reason_code == "egress_refused"
    assert kind in error.message and "KAIROS_EGRESS_ALLOW" in error.message


@pytest.mark.parametrize(
    ("url", "allow"),
    [
        ("http://10.1.2.3/", ["10.1.2.3"]),
        ("http://10.1.2.3/", ["10.0.0.0/8"]),
        ("http://127.0.0.1:8080/", ["127.0.0.1"]),
        ("http://[::1]:8080/", ["::1"]),
        ("http://[::1]:8080/", ["[::1]"]),
        ("http://[::ffff:10.0.0.1]/", ["10.0.0.0/8"]),
        ("http://[fec0::1]/", ["fec0::/10"]),
        ("http://[64:ff9b:1:a00:0:100::]/", ["64:ff9b:1::/48"]),
        ("http://[64:ff9b::8.8.8.8]/", []),  # the well-known NAT64 prefix carrying a public address
    ],
)
def test_non_public_addresses_pass_when_allowed(url: str, allow: list[str]) -> None:
    target = egress.check(url, allow=allow, resolve=no_resolution)
    assert len(target.addresses) == 1


def unreachable(host: str) -> tuple[str, str]:
    return "connect_failed", f"{host} could not be reached: no allowed address"


def test_a_host_name_resolving_to_a_private_address_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    error = refused("https://api.internal/v1", [], resolver("10.0.0.5"))
    assert (error.reason_code, error.message) == unreachable("api.internal")
    (logged,) = [vars(r) for r in caplog.records if getattr(r, "action", None) == "egress_refused"]
    assert logged["address"] == "10.0.0.5" and "private" in logged["why"]


def test_every_resolved_address_must_pass() -> None:
    error = refused("https://mixed.example/v1", [], resolver("93.184.216.34", "10.0.0.5"))
    assert (error.reason_code, error.message) == unreachable("mixed.example")


def test_a_name_that_does_not_resolve_and_one_that_resolves_privately_fail_alike() -> None:
    """No DNS oracle: whether an internal name exists, and where it points, is not in the answer."""

    def failing(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    answers = [refused("https://db.internal/v1", [], resolve)
               for resolve in (failing, resolver("10.0.0.5"), resolver("169.254.169.254"), resolver("127.0.0.1"),
                               resolver())]
    assert {(e.reason_code, e.message, e.retry_safe, e.outcome_unknown) for e in answers} == {
        (*unreachable("db.internal"), True, False)}


def test_a_listed_host_name_allows_its_private_addresses() -> None:
    target = egress.check("https://API.Internal./v1", allow=["api.internal"], resolve=resolver("10.0.0.5", "fd00::5"))
    assert target.host == "api.internal"
    assert target.addresses == ("10.0.0.5", "fd00::5")


def test_a_public_literal_address_passes_without_resolving() -> None:
    target = egress.check("https://93.184.216.34/v1/chat?x=1", allow=[], resolve=no_resolution)
    assert target == egress.ResolvedTarget(url="https://93.184.216.34/v1/chat?x=1", scheme="https",
                                           host="93.184.216.34", port=443, path="/v1/chat?x=1",
                                           addresses=("93.184.216.34",))
    assert target.host_header == "93.184.216.34"


def test_a_public_host_name_passes_with_ipv4_first() -> None:
    target = egress.check("http://api.example.com:8080", allow=[],
                          resolve=resolver("2606:2800:220:1::1", "93.184.216.34", "93.184.216.34"))
    assert target.addresses == ("93.184.216.34", "2606:2800:220:1::1")
    assert (target.port, target.path, target.host_header) == (8080, "/", "api.example.com:8080")


def test_localhost_passes_when_listed_and_is_refused_otherwise() -> None:
    target = egress.check("http://localhost:9/", allow=["localhost"])
    assert target.addresses and all(ipaddress.ip_address(a).is_loopback for a in target.addresses)
    error = refused("http://localhost:9/", [], socket.getaddrinfo)
    assert (error.reason_code, error.message) == unreachable("localhost")


def test_a_host_that_does_not_resolve_is_a_retry_safe_connect_failure() -> None:
    def failing(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    error = refused("https://nowhere.example/v1", [], failing)
    assert (error.reason_code, error.message) == unreachable("nowhere.example")
    assert error.retry_safe and not error.outcome_unknown


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("file:///etc/passwd", "egress_refused"),
        ("ftp://user:s3cr3t@93.184.216.34/x", "egress_refused"),
        ("gopher://127.0.0.1:6379/_INFO", "egress_refused"),
        ("https://user:s3cr3t@93.184.216.34/v1", "agent_invalid"),
        ("https:///v1", "agent_invalid"),
        ("https://93.184.216.34:99999/", "agent_invalid"),
    ],
)
def test_only_plain_http_and_https_urls_are_accepted(url: str, code: str) -> None:
    error = refused(url, ["127.0.0.1"])
    assert error.reason_code == code
    assert "s3cr3t" not in error.message  # credentials are not echoed


def test_allow_entries_split_into_hosts_and_networks() -> None:
    hosts, networks = egress.parse_allow([" Example.COM. ", "10.0.0.0/8", "127.0.0.1", "[::1]", "", "10.0.0.1/33"])
    assert hosts == frozenset({"example.com", "10.0.0.1/33"})  # an invalid CIDR matches no address
    assert [str(n) for n in networks] == ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]


@given(st.integers(min_value=0, max_value=2**16 - 1))
def test_no_allow_list_unlocks_ipv4_link_local(low: int) -> None:
    address = ipaddress.IPv4Address(int(ipaddress.IPv4Address("169.254.0.0")) + low)
    with pytest.raises(ExecutorError) as info:
        egress.check(f"http://{address}/", allow=[str(address), "0.0.0.0/0", "169.254.0.0/16"], resolve=no_resolution)
    assert info.value.reason_code == "egress_refused"


@pytest.mark.parametrize(("url", "allow"), [
    ("http://127.0.0.1:8001/v1", ["127.0.0.1:8001"]),
    ("http://[::1]:8001/v1", ["[::1]:8001"]),
    ("https://api.internal:8443/", ["api.internal:8443"]),
    ("http://10.0.0.7/", ["10.0.0.0/8:80"]),
])
def test_an_allow_entry_with_a_port_allows_that_port(url: str, allow: list[str]) -> None:
    target = egress.check(url, allow=allow, resolve=resolver("10.0.0.5"))
    assert target.addresses


@pytest.mark.parametrize(("url", "allow"), [
    ("http://127.0.0.1:8000/v1", ["127.0.0.1:8001"]),  # the local API beside the demo model
    ("http://127.0.0.1/", ["127.0.0.1:8001"]),
    ("http://[::1]:8000/", ["[::1]:8001"]),
    ("http://127.0.0.2:8001/", ["127.0.0.1:8001"]),
])
def test_an_allow_entry_with_a_port_allows_nothing_else(url: str, allow: list[str]) -> None:
    error = refused(url, allow)
    assert error.reason_code == "egress_refused" and "loopback" in error.message


def test_a_host_name_with_a_port_allows_that_port_only() -> None:
    assert egress.check("https://api.internal:8443/", allow=["api.internal:8443"], resolve=resolver("10.0.0.5"))
    error = refused("https://api.internal/", ["api.internal:8443"], resolver("10.0.0.5"))
    assert error.reason_code == "connect_failed"


def test_allow_entries_with_ports_count_only_for_their_port() -> None:
    entries = ["127.0.0.1:8001", "[::1]:8001", "host.internal:8443", "::1", "fd00::/8", "10.0.0.1"]
    hosts, networks = egress.parse_allow(entries, port=8001)
    assert hosts == frozenset() and [str(n) for n in networks] == ["127.0.0.1/32", "::1/128", "::1/128",
                                                                   "fd00::/8", "10.0.0.1/32"]
    hosts, networks = egress.parse_allow(entries)
    assert hosts == frozenset() and [str(n) for n in networks] == ["::1/128", "fd00::/8", "10.0.0.1/32"]
    assert egress.parse_allow(entries, port=8443)[0] == frozenset({"host.internal"})
