"""JSON as the stores keep it (node data, on both backends): read with msgspec, three times
faster than the standard library (7.3 -> 2.2 us for a step's data), which recall pays for
every node it reads. msgspec reads integers of any size as `json` does; what it refuses
(NaN and infinities, which `json.dumps` writes, and escaped lone surrogates) goes to the standard
library, so that whatever `json.dumps` wrote reads back the same."""

from __future__ import annotations

import json
from typing import Any

import msgspec

_DECODER = msgspec.json.Decoder()


def loads(text: str | bytes | bytearray | memoryview) -> Any:
    """The value of a JSON document, as `json.loads` reads it."""
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:
        return json.loads(bytes(text) if isinstance(text, memoryview) else text)
