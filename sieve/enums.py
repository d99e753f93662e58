"""Names of the `sieve.v1` enum values as Sieve shows them: without the enum's prefix ("OCR_IMAGE", not
"TASK_TYPE_OCR_IMAGE"; "HIGH", not "PRIORITY_HIGH").

Every enum of the API prefixes its values with its own name in upper snake case (buf lint STANDARD,
ENUM_VALUE_PREFIX: `TaskType` -> `TASK_TYPE_`), so the prefix is derived from the enum and not spelled at each
call. `enum_name` is for values that must be known (a validated task's type, written to PostgreSQL): an unknown
one raises ValueError. `enum_label` is for metric labels, span attributes and log lines, which must never fail:
an unknown value is shown as its number.
"""

from __future__ import annotations

import functools
import re

from google.protobuf.descriptor import EnumDescriptor
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper


@functools.cache
def _prefix(descriptor: EnumDescriptor) -> str:
    """"TaskType" -> "TASK_TYPE_"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", descriptor.name).upper() + "_"


def enum_name(enum: EnumTypeWrapper, value: int) -> str:
    """`enum_name(types_pb2.TaskType, 2)` -> "OCR_IMAGE"; ValueError for a value the enum does not have."""
    return enum.Name(value).removeprefix(_prefix(enum.DESCRIPTOR))


def enum_label(enum: EnumTypeWrapper, value: int) -> str:
    """`enum_name`, or the number as text when the enum has no such value (never raises)."""
    try:
        return enum_name(enum, value)
    except ValueError:
        return str(value)


__all__ = ["enum_label", "enum_name"]
