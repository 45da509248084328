"""Issue 53, item 11: IPv6 forms that embed an IPv4 address (NAT64, 6to4, IPv4-compatible,
Teredo, IPv4-mapped) reach that IPv4 address where routed, so the webhook guard
(connectors/webhooks.py) judges them by it: an internal IPv4 address stays refused
whichever IPv6 form wraps it. Before, only `::ffff:a.b.c.d` was unwrapped."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.webhooks import Destinations, judged_addresses

INTERNAL_V4 = [
    "127.0.0.0/8",  # loopback
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",  # link-local, cloud metadata
    "100.64.0.0/10",  # shared address space
    "0.0.0.0/8",
]
PUBLIC_V4 = ["8.8.8.8", "93.184.216.34", "1.1.1.1"]


@st.composite
def internal_v4(draw: st.DrawFn) -> ipaddress.IPv4Address:
    net = ipaddress.IPv4Network(draw(st.sampled_from(INTERNAL_V4)))
    offset = draw(st.integers(0, net.num_addresses - 1))
    return net.network_address + offset


def nat64(v4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0x64FF9B << 96) | int(v4))


def compatible(v4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(int(v4))


def mapped(v4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0xFFFF << 32) | int(v4))


def sixtofour(v4: ipaddress.IPv4Address, low80: int = 0) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0x2002 << 112) | (int(v4) << 80) | low80)


def teredo(server: ipaddress.IPv4Address, client: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    # 2001:0000:<server>:<flags>:<port ^ ffff>:<client ^ ffffffff> (RFC 4380)
    return ipaddress.IPv6Address(
        (0x20010000 << 96) | (int(server) << 64) | (0x8000 << 48) | (0x63BF << 32)
        | (int(client) ^ 0xFFFFFFFF)
    )  # fmt: skip


def translated(v4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0xFFFF0000 << 32) | int(v4))  # ::ffff:0:a.b.c.d (SIIT)


FORMS = {
    "nat64": nat64,
    "compatible": compatible,
    "mapped": mapped,
    "6to4": sixtofour,
    "translated": translated,
}


@given(v4=internal_v4(), form=st.sampled_from(sorted(FORMS)))
def test_an_internal_ipv4_is_refused_in_every_ipv6_form(
    v4: ipaddress.IPv4Address, form: str
) -> None:
    address = FORMS[form](v4)
    reason = Destinations().refusal("hook.example", str(address))
    assert reason.startswith("hook.example resolves to "), (form, address)
    assert str(v4) in reason  # the message names the embedded address


@given(v4=internal_v4(), low80=st.integers(0, 2**80 - 1))
def test_6to4_is_judged_by_its_ipv4_whatever_its_subnet_and_host(
    v4: ipaddress.IPv4Address, low80: int
) -> None:
    assert Destinations().refusal("h", str(sixtofour(v4, low80))) != ""


@given(client=internal_v4(), server=st.sampled_from(PUBLIC_V4))
def test_teredo_is_judged_by_its_client_un_xored(
    client: ipaddress.IPv4Address, server: str
) -> None:
    address = teredo(ipaddress.IPv4Address(server), client)
    assert client in judged_addresses(address)
    assert Destinations().refusal("h", str(address)) != ""


@given(low=st.integers(0, 2**80 - 1))
def test_the_local_use_nat64_prefix_is_never_public(low: int) -> None:
    address = ipaddress.IPv6Address((0x0064FF9B0001 << 80) | low)
    assert "local-use NAT64" in Destinations().refusal("h", str(address))


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::127.0.0.1",
        "64:ff9b::169.254.169.254",  # the cloud metadata endpoint through NAT64
        "64:ff9b::10.0.0.1",
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "::127.0.0.1",
        "::10.1.2.3",
        "64:ff9b:1::a00:1",
        "::ffff:0:127.0.0.1",
        "::ffff:0:169.254.169.254",
        "fec0::1",
    ],
)
def test_the_reported_attacks_are_refused(address: str) -> None:
    assert Destinations().refusal("hook.example", address) != ""


@pytest.mark.parametrize("v4", PUBLIC_V4)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_public_ipv4_in_an_ipv6_form_is_allowed(v4: str, form: str) -> None:
    address = FORMS[form](ipaddress.IPv4Address(v4))
    assert Destinations().refusal("h", str(address)) == ""


def test_the_allow_list_applies_to_the_embedded_address() -> None:
    allowed = Destinations.parse(["10.0.0.0/8"])
    assert allowed.refusal("h", "64:ff9b::10.1.2.3") == ""
    assert allowed.refusal("h", "2002:a01:203::") == ""
    assert allowed.refusal("h", "64:ff9b::192.168.1.1") != ""
    assert Destinations.parse(["64:ff9b:1::/48"]).refusal("h", "64:ff9b:1::a00:1") == ""


def test_plain_ipv6_is_judged_as_before() -> None:
    assert judged_addresses(ipaddress.IPv6Address("2606:4700:4700::1111")) == (
        ipaddress.IPv6Address("2606:4700:4700::1111"),
    )
    assert Destinations().refusal("h", "2606:4700:4700::1111") == ""
    assert Destinations().refusal("h", "fd00::1") != ""
