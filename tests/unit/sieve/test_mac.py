"""Unit tests of device id normalisation (sieve.mac.normalize_mac): every usual MAC spelling becomes
AA:BB:CC:DD:EE:FF, and anything else is refused with ValueError."""

from __future__ import annotations

import pytest

from sieve.mac import normalize_mac

CANONICAL = "AA:BB:CC:DD:EE:FF"


@pytest.mark.parametrize(
    "raw",
    [
        "AA-BB-CC-DD-EE-FF",
        "aa:bb:cc:dd:ee:ff",
        "aabb.ccdd.eeff",
        "AABBCCDDEEFF",
        "aabbccddeeff",
        "Aa:bB:cC:Dd:eE:Ff",
        "AA:BB:CC:DD:EE:FF",
        "  AA-BB-CC-DD-EE-FF  ",
        "\taa:bb:cc:dd:ee:ff\n",
        " aabb.ccdd.eeff ",
    ],
)
def test_every_usual_spelling_normalises_to_upper_case_colons(raw: str) -> None:
    assert normalize_mac(raw) == CANONICAL


def test_normalising_is_idempotent() -> None:
    once = normalize_mac("01-23-45-67-89-ab")
    assert once == "01:23:45:67:89:AB"
    assert normalize_mac(once) == once


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        "AA:BB-CC:DD-EE:FF",  # mixed separators
        "AA:BB:CC:DD:EE-FF",
        "AA-BB-CC-DD-EE:FF",
        "AABB.CCDD-EEFF",
        "AA:BB:CC:DD:EE",  # five octets
        "AA:BB:CC:DD:EE:FF:00",  # seven octets
        "AABBCCDDEE",  # ten digits
        "AABBCCDDEEFF00",  # fourteen digits
        "AABB.CCDD.EEF",
        "AABB.CCDD.EEFF.0011",
        "GG:BB:CC:DD:EE:FF",  # not hex
        "AA:BB:CC:DD:EE:FZ",
        "AABBCCDDEEFG",
        "A:BB:CC:DD:EE:FFF",  # wrong group lengths
        "AA BB CC DD EE FF",  # spaces are not separators
        "AA::BB:CC:DD:EE:FF",
        "AA:BB:CC:DD:EE:FF:",
        "AA_BB_CC_DD_EE_FF",
    ],
)
def test_anything_else_is_refused_with_a_value_error(raw: str) -> None:
    with pytest.raises(ValueError, match="is not a MAC address"):
        normalize_mac(raw)
