"""The egress check, and the one way executors reach an HTTP peer: through the address it approved.

``check(url, allow=…)`` parses the URL (http/https only, no credentials in it), resolves the host
once and returns a ``ResolvedTarget`` whose addresses have all passed: an address passes when it is
public (``ipaddress`` ``is_global``) or it, its network, or the host by name is listed in ``allow``
(``KAIROS_EGRESS_ALLOW``: hosts, addresses or CIDRs). Link-local addresses (169.254.0.0/16,
fe80::/10), cloud metadata endpoints, multicast (224.0.0.0/4, ff00::/8) and the unspecified address
are refused always, listed or not. ``ipaddress`` calls some ranges global that are not public
destinations (``NOT_PUBLIC``: site-local fec0::/10, the local-use NAT64 prefix 64:ff9b:1::/48,
documentation and SRv6 ranges): they are refused unless listed, like private ones. An IPv6 address
that embeds an IPv4 one (mapped, translated, compatible, NAT64 — well-known or local-use — 6to4,
Teredo) is judged by that too. A refused literal address is ``ExecutorError("egress_refused")``
naming the address and why. A host *name* that does not resolve, or resolves to an address that is
refused, is one and the same ``connect_failed`` (retry-safe: nothing was sent) with one message: a
run's reason must not tell an owner what the function's resolver knows (which internal names exist
and where they point). The difference is logged for the operator only (``egress.unresolved`` /
``egress_refused``).

An allow entry may name a port (``127.0.0.1:8001``, ``[::1]:8001``, ``host.internal:8443``): it then
allows that port only. The local stack allows its demo model that way, and nothing else on loopback.

``post(target, …)`` sends one POST to an approved address and never resolves the name again, so a
DNS answer that changes between check and connect (rebinding) cannot redirect it: the TCP connection
goes to the pinned IP, while the ``Host`` header, TLS SNI and certificate check use the original host.
It follows no redirects, retries nothing, bounds connect and read time, and reads at most
``read_limit`` bytes. With ``sink_for``, a 2xx answer the caller wants as a stream (it returns a
``Sink`` for the status and content type, e.g. ``text/event-stream``) is handed over chunk by chunk
as it arrives and not kept: the sink bounds what it holds, and stops the read by answering False.
Failures come back as ``TransportFailure`` with the stage they happened in, so
each executor applies its own table of what the stage proves about the outcome.

This module never logs request bodies or headers (they carry prompts and credentials).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any, Literal
from urllib.parse import urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError, ProtocolError, ReadTimeoutError

from kairos.executors.base import Abort, ExecutorError, ResolvedTarget
from kairos.observability import logger

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[..., Sequence[tuple[Any, ...]]]

# Refused whatever KAIROS_EGRESS_ALLOW says, each with the reason a refusal names.
ALWAYS_REFUSED: tuple[tuple[IPNetwork, str], ...] = (
    (ipaddress.ip_network("169.254.169.254/32"), "a cloud metadata address"),  # AWS, GCP, Azure, OCI IMDS
    (ipaddress.ip_network("169.254.170.2/32"), "a container credentials address"),  # ECS task metadata
    (ipaddress.ip_network("169.254.0.0/16"), "a link-local address"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "a cloud metadata address"),  # AWS IMDS over IPv6
    (ipaddress.ip_network("fe80::/10"), "a link-local address"),
    (ipaddress.ip_network("100.100.100.200/32"), "a cloud metadata address"),  # Alibaba Cloud
    (ipaddress.ip_network("168.63.129.16/32"), "a cloud platform address"),  # Azure WireServer
    (ipaddress.ip_network("0.0.0.0/8"), "the unspecified address (it reaches this host)"),
    (ipaddress.ip_network("::/128"), "the unspecified address (it reaches this host)"),
    (ipaddress.ip_network("224.0.0.0/4"), "a multicast address"),
    (ipaddress.ip_network("ff00::/8"), "a multicast address"),
)
# Not public destinations, though ``ipaddress.is_global`` (Python 3.11) says they are.
NOT_PUBLIC: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("fec0::/10"),  # site-local (deprecated, still routed inside some sites)
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use IPv4/IPv6 translation (RFC 8215)
    ipaddress.ip_network("3fff::/20"),  # documentation (RFC 9637)
    ipaddress.ip_network("5f00::/16"),  # SRv6 SIDs (RFC 9602)
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")
_V4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")


# Takes the next bytes of a streamed answer as they arrive; False stops the read (the rest is not read).
Sink = Callable[[bytes], bool]
# Given a 2xx answer's status and content type: the sink to stream its body into, or None to read it whole.
SinkFor = Callable[[int, str], Sink | None]


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # at most read_limit bytes (empty when streamed into a sink)
    overflow: bool  # the peer sent more than read_limit bytes, or the sink stopped the read
    streamed: bool = False  # the body went to the caller's sink as it arrived


class TransportFailure(Exception):
    """What went wrong, by stage: ``connect`` (nothing was sent), ``timeout`` (sent, no complete answer
    in time) or ``dropped`` (the connection broke after the request started). ``status`` is set when the
    response's status line had arrived before the failure; ``partial`` holds the body read so far."""

    def __init__(self, stage: Literal["connect", "timeout", "dropped"], detail: str, *,
                 status: int | None = None, partial: bytes = b"") -> None:
        super().__init__(f"{stage}: {detail}")
        self.stage = stage
        self.detail = detail
        self.status = status
        self.partial = partial


def parse_allow(allow: Sequence[str], *, port: int | None = None) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    """Split ``KAIROS_EGRESS_ALLOW`` entries into host names and networks (an address is a /32 or /128).

    An entry may name a port (``127.0.0.1:8001``, ``[::1]:8001``, ``host.internal:8443``): it counts
    only for a destination on that ``port`` (and never when ``port`` is None)."""
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for raw in allow:
        entry, entry_port = _entry_port(raw.strip())
        if not entry or (entry_port is not None and entry_port != port):
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            hosts.add(_normal_host(entry))
    return frozenset(hosts), tuple(networks)


def _entry_port(entry: str) -> tuple[str, int | None]:
    """An allow entry and the port it names, if any: ``[v6]:port`` or ``name-or-v4:port`` (a bare IPv6
    address or network, with its many colons, names none)."""
    if entry.startswith("[") and "]:" in entry:
        address, _, port = entry[1:].partition("]:")
        return (address, int(port)) if port.isdigit() else (entry, None)
    name, colon, port = entry.rpartition(":")
    if colon and ":" not in name and port.isdigit():
        return name, int(port)
    return entry, None


def check(url: str, *, allow: Sequence[str], resolve: Resolver = socket.getaddrinfo) -> ResolvedTarget:
    """Resolve ``url``'s host once and approve every address, or raise ``ExecutorError``."""
    scheme, host, port, path = _split(url)
    allowed_hosts, allowed_networks = parse_allow(allow, port=port)
    literal = _literal(host)
    addresses = [literal] if literal is not None else _resolve(host, port, resolve)
    approved: list[IPAddress] = []
    for address in addresses:
        refusal = _refusal(address, host_allowed=host in allowed_hosts, networks=allowed_networks)
        if refusal is not None:
            logger.warning("egress refused", extra={"action": "egress_refused", "host": host, "address": str(address),
                                                    "why": refusal})
            if literal is None:
                raise _unreachable(host)  # the same answer as a name that does not resolve
            raise ExecutorError("egress_refused", f"egress to {host} refused: {address} is {refusal}")
        approved.append(address)
    ordered = sorted(dict.fromkeys(approved), key=lambda a: a.version)  # IPv4 first: Lambda may lack IPv6
    return ResolvedTarget(url=url, scheme=scheme, host=host, port=port, path=path,
                          addresses=tuple(str(a) for a in ordered))


def post(target: ResolvedTarget, *, body: bytes, headers: dict[str, str], timeout: float,
         read_limit: int, ca_certs: str | None = None, abort: Abort | None = None,
         sink_for: SinkFor | None = None) -> Answer:
    """One POST to ``target``'s pinned addresses (the next one only when connecting failed).

    A fired ``abort`` stops it: before the request is sent as ``connect`` (nothing was sent), after
    that as ``dropped`` (the peer may have received it), even when the peer had answered by then."""
    if not target.addresses:
        raise ExecutorError("egress_refused", f"egress to {target.host} refused: no checked address")
    last: TransportFailure | None = None
    for address in target.addresses:
        try:
            return _post_once(target, address, body=body, headers=headers, timeout=timeout,
                              read_limit=read_limit, ca_certs=ca_certs, abort=abort, sink_for=sink_for)
        except TransportFailure as failure:
            if failure.stage != "connect":
                raise
            last = failure
    if last is None:  # unreachable: addresses is not empty, and each one either returned or failed to connect
        raise RuntimeError(f"no address of {target.host} was tried")
    raise last


def _post_once(target: ResolvedTarget, address: str, *, body: bytes, headers: dict[str, str], timeout: float,
               read_limit: int, ca_certs: str | None, abort: Abort | None, sink_for: SinkFor | None) -> Answer:
    deadline = time.monotonic() + timeout
    if abort is not None and abort.fired:
        raise TransportFailure("connect", "aborted")
    conn: HTTPConnection
    if target.scheme == "https":
        pinned_name = None if _literal(target.host) is not None else target.host
        conn = HTTPSConnection(address, target.port, timeout=min(timeout, 10.0), cert_reqs="CERT_REQUIRED",
                               ca_certs=ca_certs, server_hostname=pinned_name,
                               assert_hostname=pinned_name or target.host)
    else:
        conn = HTTPConnection(address, target.port, timeout=min(timeout, 10.0))
    sent = {"Host": target.host_header, "Accept-Encoding": "identity", **headers}
    attached: Any = None
    try:
        # Connect (and finish the TLS handshake) on its own first: a failure here proves nothing was sent,
        # while any failure after it may come after the peer received the request.
        try:
            conn.connect()
        except (HTTPError, OSError, ValueError) as exc:  # refused, unreachable, timeout, TLS/certificate
            raise TransportFailure("connect", _describe(exc)) from exc
        if abort is not None:
            if conn.sock is None or not abort.attach(conn.sock):
                raise TransportFailure("connect", "aborted")
            attached = conn.sock
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request("POST", target.path, body=body, headers=sent, preload_content=False)
            response = conn.getresponse()
        except (TimeoutError, ReadTimeoutError) as exc:
            raise _aborted(abort) or TransportFailure("timeout", "no answer in time") from exc
        except (HTTPError, HTTPException, OSError) as exc:
            raise _aborted(abort) or TransportFailure("dropped", _describe(exc)) from exc
        sink = None
        if sink_for is not None and 200 <= response.status < 300:
            sink = sink_for(response.status, response.headers.get("Content-Type", ""))
        try:
            answer = _read_bounded(response, deadline=deadline, read_limit=read_limit, sink=sink)
        except TransportFailure as failure:
            raise _aborted(abort, failure) or failure from failure.__cause__
        # A shut-down socket reads as a clean end, so an answer read while the abort fired may be cut
        # short: it is reported as dropped, with the status and what was read.
        aborted = _aborted(abort, TransportFailure("dropped", "aborted", status=answer.status, partial=answer.body))
        if aborted is not None:
            raise aborted
        return answer
    finally:
        if attached is not None and abort is not None:
            abort.detach(attached)
        conn.close()


def _aborted(abort: Abort | None, failure: TransportFailure | None = None) -> TransportFailure | None:
    """The failure of a call whose abort fired after its request went out, else None."""
    if abort is None or not abort.fired:
        return None
    status = None if failure is None else failure.status
    return TransportFailure("dropped", "aborted", status=status, partial=b"" if failure is None else failure.partial)


def _read_bounded(response: urllib3.BaseHTTPResponse, *, deadline: float, read_limit: int,
                  sink: Sink | None = None) -> Answer:
    status = response.status
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            if time.monotonic() > deadline:
                raise TransportFailure("timeout", "the answer did not complete in time", status=status,
                                       partial=b"".join(chunks))
            chunk = response.read1(min(65_536, read_limit + 1 - size) if sink is None else 65_536)
            if not chunk:
                return Answer(status=status, body=b"".join(chunks), overflow=False, streamed=sink is not None)
            if sink is not None:  # handed over, not kept: the sink bounds what it holds
                if not sink(chunk):
                    return Answer(status=status, body=b"", overflow=True, streamed=True)
                continue
            chunks.append(chunk)
            size += len(chunk)
            if size > read_limit:
                return Answer(status=status, body=b"".join(chunks)[:read_limit], overflow=True)
    except (TimeoutError, ReadTimeoutError) as exc:
        raise TransportFailure("timeout", "the answer did not complete in time", status=status,
                               partial=b"".join(chunks)) from exc
    except (ProtocolError, HTTPError, OSError) as exc:
        raise TransportFailure("dropped", _describe(exc), status=status, partial=b"".join(chunks)) from exc
    finally:
        response.release_conn()


def _split(url: str) -> tuple[Literal["http", "https"], str, int, str]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ExecutorError("agent_invalid", "base_url is not a valid URL") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = scheme if scheme.isalnum() and len(scheme) <= 16 else "this"
        raise ExecutorError("egress_refused", f"egress refused: the {shown} scheme is not allowed, only http and https")
    if parts.username is not None or parts.password is not None:
        raise ExecutorError("agent_invalid", "base_url must not carry credentials; reference them in api_key_secret")
    if not parts.hostname:
        raise ExecutorError("agent_invalid", "base_url has no host")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    normal_scheme: Literal["http", "https"] = "https" if scheme == "https" else "http"
    return normal_scheme, _normal_host(parts.hostname), port or (443 if scheme == "https" else 80), path


def _normal_host(host: str) -> str:
    return host.strip("[]").rstrip(".").lower()


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _unreachable(host: str) -> ExecutorError:
    """The one failure of a host name without an approved address, whether it did not resolve or
    resolved to a refused address: same reason, same retry, same message."""
    return ExecutorError("connect_failed", f"{host} could not be reached: no allowed address", retry_safe=True)


def _resolve(host: str, port: int, resolve: Resolver) -> list[IPAddress]:
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        logger.warning("host did not resolve", extra={"action": "egress_unresolved", "host": host,
                                                        "error": type(exc).__name__})
        raise _unreachable(host) from exc
    addresses: list[IPAddress] = []
    for info in infos:
        raw = str(info[4][0]).split("%", 1)[0]  # drop an IPv6 zone id
        addresses.append(ipaddress.ip_address(raw))
    if not addresses:
        logger.warning("host did not resolve", extra={"action": "egress_unresolved", "host": host,
                                                        "error": "no_address"})
        raise _unreachable(host)
    return addresses


def _embedded(address: IPAddress) -> list[IPAddress]:
    """The address and any IPv4 address an IPv6 one carries inside it."""
    found: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            found.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            found.append(address.sixtofour)
        if address.teredo is not None:
            found.extend(address.teredo)
        if address in _NAT64 or address in _V4_TRANSLATED or (address in _V4_COMPATIBLE and int(address) > 1):
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address in _LOCAL_NAT64:  # a /48 prefix: the IPv4 address is in bits 48-63 and 72-87 (RFC 6052)
            packed = address.packed
            found.append(ipaddress.IPv4Address(packed[6:8] + packed[9:11]))
    return found


def _refusal(address: IPAddress, *, host_allowed: bool,
             networks: tuple[IPNetwork, ...]) -> str | None:
    """Why ``address`` may not be reached, or None when it may."""
    inner = _embedded(address)
    for candidate in inner:
        for network, reason in ALWAYS_REFUSED:
            if candidate.version == network.version and candidate in network:
                return f"{reason}, refused always"
    if host_allowed or any(c.version == n.version and c in n for c in inner for n in networks):
        return None
    for candidate in inner:
        if not candidate.is_global or any(candidate.version == n.version and candidate in n for n in NOT_PUBLIC):
            return f"{_kind(candidate)}; list the host or a CIDR in KAIROS_EGRESS_ALLOW to allow it"
    return None


def _kind(address: IPAddress) -> str:
    if address.is_loopback:
        return "a loopback address"
    if address.is_private:
        return "a private address"
    if address.is_multicast:
        return "a multicast address"
    return "not a public address"


def _describe(exc: BaseException) -> str:
    """The underlying cause's class name (e.g. ``ConnectionRefusedError``): short, and free of content."""
    inner: BaseException | None = exc.__cause__ or exc.__context__
    if isinstance(exc, ProtocolError) and len(exc.args) > 1 and isinstance(exc.args[1], BaseException):
        inner = exc.args[1]
    return type(inner or exc).__name__
