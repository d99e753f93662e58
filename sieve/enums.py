"""Names of the `sieve.v1` enum values as Sieve shows them: without the enum's prefix ("OCR_IMAGE", not
"TASK_TYPE_OCR_IMAGE"; "HIGH", not "PRIORITY_HIGH").

Every enum of the API prefixes its values with its own name in upper snake case (buf lint STANDARD,
ENUM_VALUE_PREFIX: `TaskType` -> `TASK_TYPE_`), so the prefix is derived from the enum and not spelled at each
call. `enum_name` is for values that must be known (a validated task's type, written to PostgreSQL): an unknown
one raises ValueError. `enum_label` is for metric labels, span attributes and log lines, which must never fail:
an unknown value is shown as its number.

`enum_value` only types: protobuf's stubs type an enum field with its enum class, while the values Sieve reads
from PostgreSQL, Redis or another message are plain ints (as they are at run time in the messages too).
"""

from __future__ import annotations

import functools
import re
from typing import TypeVar, cast

from google.protobuf.descriptor import EnumDescriptor
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

_E = TypeVar("_E", bound=int)


@functools.cache
def _prefix(descriptor: EnumDescriptor) -> str:
    """ "TaskType" -> "TASK_TYPE_"."""
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


def enum_value(enum: type[_E], value: int) -> _E:
    """`value` as a value of `enum` for the type checker (`types_pb2.Task(type=enum_value(TaskType, t))`);
    unchanged, unchecked."""
    return cast(_E, value)


__all__ = ["enum_label", "enum_name", "enum_value"]
