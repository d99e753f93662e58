"""Device ids: MAC addresses in any usual spelling, normalised to one form (AA:BB:CC:DD:EE:FF)."""

from __future__ import annotations

import re

_HEX12 = re.compile(r"[0-9A-Fa-f]{12}")
_SEPARATED = re.compile(r"[0-9A-Fa-f]{2}([:-])(?:[0-9A-Fa-f]{2}\1){4}[0-9A-Fa-f]{2}")
_DOTTED = re.compile(r"[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4}")
_CANONICAL = re.compile(r"[0-9A-F]{2}(?::[0-9A-F]{2}){5}")


def normalize_mac(raw: str) -> str:
    """Returns the MAC as AA:BB:CC:DD:EE:FF.

    Accepts `AA-BB-CC-DD-EE-FF`, `aa:bb:cc:dd:ee:ff`, `aabb.ccdd.eeff` and `AABBCCDDEEFF`; surrounding
    whitespace is ignored. Raises ValueError for anything else (mixed separators included).
    """
    if _CANONICAL.fullmatch(raw):  # the usual case, already in the one form
        return raw
    text = raw.strip()
    if _SEPARATED.fullmatch(text) or _DOTTED.fullmatch(text) or _HEX12.fullmatch(text):
        digits = re.sub(r"[^0-9A-Fa-f]", "", text).upper()
        return ":".join(digits[i : i + 2] for i in range(0, 12, 2))
    raise ValueError(f"{raw!r} is not a MAC address")
