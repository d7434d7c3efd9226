"""One error root and one way a name becomes a member of a closed set: every exception is a
`TokentrailError`, bad input an `InvalidInput` (a `ValueError`) with a 4xx, an engine's failure
a 502; a name outside a closed set is refused naming the allowed values, wherever it is given."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from aiohttp import web

from tokentrail import errors, kinds
from tokentrail.adapter.config import SessionSettings
from tokentrail.adapter.http.middleware import status_of
from tokentrail.errors import (
    EngineError,
    EngineOutputError,
    InvalidInput,
    JournalError,
    PolicyError,
    RequestError,
    TokentrailError,
    UnknownName,
)
from tokentrail.kinds import DriftPolicy, History, SyncMode, parse_kind
from tokentrail.scale.spec import ActorSpec
from tokentrail.storage.journal import Journal
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.manager import TrajectoryManager
from tokentrail.trajectory.pipeline import TurnPipeline

EXCEPTIONS = [
    c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, BaseException)
]


def test_every_exception_is_under_one_root_with_a_status() -> None:
    assert len(EXCEPTIONS) > 30
    for cls in EXCEPTIONS:
        assert issubclass(cls, TokentrailError), cls
        if cls.status < 500:
            # A refusal of the request is bad input, and a ValueError like the core's errors.
            assert issubclass(cls, InvalidInput) and issubclass(cls, ValueError), cls
        else:
            assert not issubclass(cls, InvalidInput), cls


def test_one_place_maps_an_exception_to_its_status() -> None:
    assert status_of(EngineError("down", 503)) == 502
    assert status_of(EngineOutputError("empty", "no tokens")) == 502
    assert status_of(errors.SessionClosed("s")) == 410
    assert status_of(errors.Overloaded("busy")) == 503
    assert status_of(RequestError("bad")) == 400
    assert status_of(web.HTTPNotFound()) == 404
    assert status_of(RuntimeError("bug")) == 500
    # The engine's own status stays readable, apart from what the harness is answered.
    assert EngineError("down", 503).engine_status == 503
    assert str(EngineError("down", 503)) == "down (HTTP 503)"


def test_parse_kind_takes_members_and_their_strings_and_names_the_rest() -> None:
    assert parse_kind(History, "render", "history mode") is History.RENDER
    assert parse_kind(History, History.SPLICE, "history mode") is History.SPLICE
    with pytest.raises(UnknownName) as caught:
        parse_kind(History, "bogus", "history mode")
    assert str(caught.value) == "unknown history mode 'bogus'; expected one of ('splice', 'render')"
    with pytest.raises(PolicyError, match=r"unknown drift policy 3; expected one of"):
        parse_kind(DriftPolicy, 3, "drift policy", PolicyError)
    # The same spelling as the Rust core's refusal of a policy name.
    with pytest.raises(PolicyError) as caught:
        parse_kind(DriftPolicy, "greedy", "drift policy", PolicyError)
    assert (
        str(caught.value) == "unknown drift policy 'greedy'; expected one of ('minimal', 'slime')"
    )


def test_every_entry_point_refuses_an_unknown_name_with_the_allowed_values(
    tmp_path: Path,
) -> None:
    tokenizer = load_tokenizer("builtin:qwen3")
    cases = [
        (lambda: TurnPipeline(TrajectoryManager(), tokenizer, history="bogus"), UnknownName),
        (lambda: TurnPipeline(TrajectoryManager(), tokenizer, restore="bogus"), UnknownName),
        (lambda: TrajectoryManager(drift_policy="bogus"), PolicyError),
        (lambda: TrajectoryManager(rewrite_policy="bogus"), PolicyError),
        (lambda: Journal(tmp_path / "j.db", sync="bogus"), JournalError),
        (lambda: ActorSpec(journal_sync="bogus").check(), JournalError),
        (lambda: SessionSettings(history="bogus"), UnknownName),
        (lambda: SessionSettings(retry="bogus"), UnknownName),
    ]
    for make, error in cases:
        with pytest.raises(error, match=r"'bogus'; expected one of \('") as caught:
            make()
        assert isinstance(caught.value, InvalidInput)
    assert not (tmp_path / "j.db").exists()


def test_closed_sets_spelled_once() -> None:
    assert [m.value for m in SyncMode] == ["normal", "full"]
    assert kinds.REASONING_FIELDS == ("reasoning_content", "thinking", "reasoning")
