"""Port picking for local stacks and private brokers (tools/stack/ports.py)."""

from __future__ import annotations

import pytest

from tools.stack import ports

LOW = 30100
"""The kernel's first ephemeral port, as these tests pretend: picks start at 22000 below it."""


def test_a_brokers_ports_lie_below_the_ephemeral_range_and_avoid_those_handed_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: LOW)
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    ports.reserve(*range(22000, LOW - 20))          # only the last 20 ports are left for a span of 6
    for _ in range(50):
        base = ports.below_ephemeral(6)
        assert base >= LOW - 20 and base + 6 < LOW and base % 2 == 0, base
    ports.reserve(*range(LOW - 20, LOW))
    with pytest.raises(RuntimeError, match="handed out"):
        ports.below_ephemeral(6)


def test_a_service_port_is_never_one_reserved_for_a_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: LOW)
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    reserved = range(22000, LOW - 100)
    ports.reserve(*reserved)
    picked = {ports.free_port() for _ in range(5)}
    assert not picked & set(reserved), picked
