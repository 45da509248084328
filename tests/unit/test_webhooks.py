"""Where webhooks may go (connectors/webhooks.py): public addresses only unless allowed,
judged on the addresses a name resolves to, the connection pinned to the address
judged (a second resolution cannot move it), against real local HTTP servers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from connectors.webhooks import DestinationRefused, Destinations, guarded_client

INSIDE = [
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "169.254.169.254",  # cloud metadata
    "fe80::1",
    "10.1.2.3",
    "172.16.0.9",
    "192.168.1.1",
    "fd00::7",
    "100.64.0.1",  # shared address space
    "224.0.0.1",
    "ff02::1",
    "0.0.0.0",
    "::",
    "::ffff:127.0.0.1",  # loopback, mapped into IPv6
    "::ffff:169.254.169.254",
]
PUBLIC = ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111"]


@pytest.mark.parametrize("address", INSIDE)
def test_addresses_inside_are_refused_by_default(address: str) -> None:
    reason = Destinations().refusal("hook.example", address)
    assert reason.startswith("hook.example resolves to ")
    assert "--allow-destination" in reason


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert Destinations().refusal("hook.example", address) == ""


def test_the_operator_allows_networks_and_names() -> None:
    allowed = Destinations.parse(["10.20.0.0/16", "192.168.5.5", " hooks.internal. ", ""])
    assert allowed.refusal("a", "10.20.3.4") == ""
    assert allowed.refusal("a", "192.168.5.5") == ""
    assert allowed.refusal("a", "10.21.0.1") != ""
    assert allowed.refusal("HOOKS.internal", "10.99.0.1") == ""
    assert allowed.refusal("other.internal", "10.99.0.1") != ""


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "not a host", "a/b"])
def test_a_bad_allowance_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="--allow-destination"):
        Destinations.parse([bad])


class Server:
    def __init__(self, host: str, port: int = 0) -> None:
        self.calls: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                server.calls.append(self.headers.get("Host", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.http = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.http.server_address[1])
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def loopback() -> Iterator[Server]:
    server = Server("127.0.0.1")
    yield server
    server.close()


def test_a_webhook_at_loopback_is_refused_before_any_connection(loopback: Server) -> None:
    with guarded_client(Destinations(), 5) as client:
        for url in (f"http://127.0.0.1:{loopback.port}/", f"http://localhost:{loopback.port}/"):
            with pytest.raises(DestinationRefused, match="loopback"):
                client.post(url, content=b"{}")
    assert loopback.calls == []


def test_an_allowed_receiver_is_called(loopback: Server) -> None:
    with guarded_client(Destinations.parse(["127.0.0.1/32"]), 5) as client:
        answer = client.post(f"http://127.0.0.1:{loopback.port}/", content=b"{}")
    assert answer.status_code == 200
    assert loopback.calls == [f"127.0.0.1:{loopback.port}"]


def test_a_name_that_resolves_elsewhere_the_second_time_cannot_move_the_connection() -> None:
    """DNS rebinding: the name first resolves to an allowed address, then to loopback.
    The connection goes to the address judged; the name is not resolved again for it."""
    allowed = Server("127.0.0.2")
    inside = Server("127.0.0.1", allowed.port)  # the same port on the address refused
    answers = iter([["127.0.0.2"], ["127.0.0.1"], ["127.0.0.1"]])
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return next(answers)

    try:
        with guarded_client(Destinations.parse(["127.0.0.2/32"]), 5, rebinding) as client:
            answer = client.post(f"http://rebind.example:{allowed.port}/", content=b"{}")
            assert answer.status_code == 200
    finally:
        allowed.close()
        inside.close()
    assert asked == ["rebind.example"]  # once, for the one connection
    assert allowed.calls == [f"rebind.example:{allowed.port}"]  # the Host header kept
    assert inside.calls == []
