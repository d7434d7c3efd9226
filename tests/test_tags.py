"""A turn's tags as a typed record: written as the JSON object the tree and the journal have
always held (same keys, same order), and read back as the record it was written from."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrail.trajectory.tags import TurnTags

names = st.text("abcdefgh_", min_size=1, max_size=6)
served = st.fixed_dictionaries(
    {
        "protocol": st.sampled_from(["anthropic", "openai", "responses"]),
        "request_id": names,
        "reply_id": names,
        "call_ids": st.lists(names, max_size=3).map(tuple),
        "ill_formed": st.none() | names,
    }
)
tags = st.builds(
    lambda adapter, history, excluded, withheld, media, choice, forced, prefill, extra: TurnTags(
        **(adapter or {}),
        history=history,
        excluded=excluded,
        withheld_tools=withheld,
        dropped_media=media,
        tool_choice=choice,
        forced_tool=forced if choice is not None else None,
        prefill=prefill,
        extra=extra,
    ),
    st.none() | served,
    st.none() | st.sampled_from(["splice", "render", "splice_fallback:length"]),
    st.none() | names,
    st.lists(names, max_size=3).map(tuple),
    st.dictionaries(st.sampled_from(["image", "audio", "document"]), st.integers(1, 5)),
    st.none() | st.sampled_from(["none", "required"]),
    st.none() | names,
    st.booleans(),
    st.dictionaries(st.sampled_from(["trainer_step", "task"]), st.integers(0, 9)),
)


@settings(max_examples=100, deadline=None)
@given(tags)
def test_tags_read_back_from_their_json_are_the_tags_written(record: TurnTags) -> None:
    stored = json.loads(json.dumps(record.as_metadata()))
    assert TurnTags.read(stored) == record
    assert TurnTags.read(stored).as_metadata() == stored


def test_the_json_keys_and_their_order_are_the_journals() -> None:
    record = TurnTags(
        protocol="responses",
        request_id="r1",
        reply_id="resp_1",
        call_ids=("call_a",),
        ill_formed=None,
        history="splice",
        excluded="memory",
        withheld_tools=("web_search",),
        dropped_media={"image": 2},
        tool_choice="required",
        forced_tool="Read",
        prefill=True,
        extra={"task": 7},
    )
    assert list(record.as_metadata().items()) == [
        ("protocol", "responses"),
        ("request_id", "r1"),
        ("reply_id", "resp_1"),
        ("call_ids", ["call_a"]),
        ("ill_formed", None),
        ("history", "splice"),
        ("excluded", "memory"),
        ("withheld_tools", ["web_search"]),
        ("dropped_media", {"image": 2}),
        ("tool_choice", "required"),
        ("forced_tool", "Read"),
        ("prefill", True),
        ("task", 7),
    ]
    # A turn recorded without the adapter (a trainer's own metadata) keeps just its keys.
    assert TurnTags.read({"task": 7}).as_metadata() == {"task": 7}
    assert TurnTags().as_metadata() == {}
