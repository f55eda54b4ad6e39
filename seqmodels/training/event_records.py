"""TensorBoard event records, encoded here: the bytes of an ``events.out.tfevents.*`` file without importing a writer.

An event file is a sequence of TFRecords, each ``uint64 length (little-endian), masked CRC-32C of those 8 bytes,
the payload, masked CRC-32C of the payload``, where the mask is ``rotate_right(crc, 15) + 0xa282ead8`` (mod 2**32).
Each payload is a serialized ``tensorflow.Event`` protocol buffer; the fields written here are

- ``Event``: ``double wall_time = 1``, ``int64 step = 2``, and one of ``string file_version = 3``,
  ``Summary summary = 5``, ``SessionLog session_log = 7``;
- ``Summary``: ``repeated Value value = 1``; ``Summary.Value``: ``string tag = 1``, ``float simple_value = 2``;
- ``SessionLog``: ``SessionStatus status = 1`` (``START = 1``).

Encoded as protobuf's own serializer does (fields in number order, a proto3 ``step`` of 0 left out, a oneof member
written even when 0), so the bytes equal tensorboardX's ``Event(...).SerializeToString()`` framed by its
``RecordWriter`` (tests/seqmodels/training/test_event_records.py compares them). tensorboardX itself is not
imported: its package imports ``torch`` when torch is installed, about 2 s of every ``train.py`` start.
Tags are cleaned as tensorboardX cleans them: a character outside ``[-/\\w.]`` becomes ``_``, leading ``/`` go.
"""

from __future__ import annotations

import math
import re
import struct

_INVALID_TAG_CHARACTERS = re.compile(r"[^-/\w.]")
_MASK_DELTA = 0xA282EAD8
_SESSION_START = 1


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # the Castagnoli polynomial, reflected
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as TFRecord framing uses it (RFC 3720's check value: ``b"123456789"`` ->
    ``0xe3069283``)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def record(payload: bytes) -> bytes:
    """``payload`` framed as one TFRecord."""
    if not isinstance(payload, bytes):
        raise TypeError(f"a record's payload must be bytes, not {type(payload).__name__}")
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", _masked_crc(length)) + payload + struct.pack("<I", _masked_crc(payload))


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # a negative int64 as protobuf writes it: ten bytes, two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # past float32's range: infinite, as a C cast (and protobuf's serializer) makes it
        return struct.pack("<f", math.copysign(math.inf, value))


def _length_delimited(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def clean_tag(tag: str) -> str:
    """``tag`` as TensorBoard will show it (tensorboardX's rule, kept so that the tags of earlier runs match)."""
    return _INVALID_TAG_CHARACTERS.sub("_", tag).lstrip("/")


def event(wall_time: float, step: int = 0, *, file_version: str | None = None,
          scalars: dict[str, float] | None = None, session_start: bool = False) -> bytes:
    """One serialized ``Event``: exactly one of ``file_version``, ``scalars`` (tag -> value, one ``Summary``) or
    ``session_start`` (a ``SessionLog`` of status START, which tells TensorBoard to drop the events it holds
    from ``step`` on)."""
    if not isinstance(wall_time, (int, float)) or isinstance(wall_time, bool) or not math.isfinite(wall_time):
        raise ValueError(f"wall_time must be a finite number of seconds, not {wall_time!r}")
    if not isinstance(step, int) or isinstance(step, bool) or not -2**63 <= step < 2**63:
        raise ValueError(f"step must be an int64, not {step!r}")
    if (file_version is not None) + (scalars is not None) + bool(session_start) != 1:
        raise ValueError("an event holds exactly one of file_version, scalars or session_start")
    out = b"\x09" + struct.pack("<d", wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if file_version is not None:
        out += _length_delimited(3, file_version.encode())
    elif scalars is not None:
        values = b""
        for tag, value in scalars.items():
            if not isinstance(tag, str):
                raise TypeError(f"a scalar's tag must be a str, not {type(tag).__name__}")
            value_bytes = _length_delimited(1, clean_tag(tag).encode()) + b"\x15" + _float32(float(value))
            values += _length_delimited(1, value_bytes)
        out += _length_delimited(5, values)
    else:
        out += _length_delimited(7, b"\x08" + _varint(_SESSION_START))
    return out
