"""Kubernetes quantities as numbers: ``8``, ``"8"``, ``"500m"``, ``"2Ki"``, ``"1.5"``, as
resource requests, Kueue's quotas and its messages (``4 more needed``, ``5Mi more needed``)
write them."""

from __future__ import annotations

import re

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?)(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_SCALE = {None: 1.0, "m": 1e-3, "k": 1e3, "Ki": 1024.0, "M": 1e6, "Mi": 1024.0 ** 2,
          "G": 1e9, "Gi": 1024.0 ** 3, "T": 1e12, "Ti": 1024.0 ** 4}


def quantity_value(value: object) -> float:
    """The number a quantity stands for; ``ValueError`` if it is none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = _QUANTITY.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"not a quantity: {value!r}")
    return float(m.group(1)) * _SCALE[m.group(2)]
