"""The generic pipe codec keeps record and enum types, all the way down."""

from __future__ import annotations

import pytest

from actors.group import events
from actors.group.messages import CommitEntry, CommitOffsets, FetchedOffset
from shards.pipe_codec import pack, unpack
from wire.errors import ErrorCode

pytestmark = pytest.mark.timeout(10)


def test_named_tuples_dataclasses_and_enums_survive() -> None:
    commit = CommitOffsets("g", 3, "m-1", "static-1", [CommitEntry("t", 2, 40, 7, "meta")], None)
    back = unpack(pack(commit))
    assert type(back) is CommitOffsets and back.entries[0] == CommitEntry("t", 2, 40, 7, "meta")
    join = events.Join(
        "g", "", None, "c", "/h", 10_000, 30_000, "consumer", (("range", b"\x00\x01"),), True, None
    )
    assert unpack(pack(join)) == join
    errors = unpack(pack((ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID])))
    assert errors == (ErrorCode.NONE, (ErrorCode.UNKNOWN_MEMBER_ID,))
    assert type(errors[1][0]) is ErrorCode
    assert unpack(pack([FetchedOffset("t", 0, None)])) == (FetchedOffset("t", 0, None),)


def test_an_unregistered_type_fails_loudly() -> None:
    class Stray(tuple):  # a named tuple the registry does not know
        _fields = ("a",)

    with pytest.raises(AssertionError, match="not a registered pipe type"):
        pack(Stray((1,)))
