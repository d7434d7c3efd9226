"""What slime's own agent tests read of the drop-in, held without a slime checkout.

`make test-slime SLIME=PATH` runs slime's test files against `tokentrail.integrations.slime`;
CI has no slime, so this file keeps that surface working: the read-only `_trees` view in
slime's node shape, slime's logprob-length error, logprobs back as given, the adapter modules'
helpers under slime's names and signatures, `common.call_sglang_generate` as the seam every
drop-in turn goes through, and a tokenizer object with no `tokenizers` backend (a small
word-level Python class, as slime's tests use) served through its own methods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from support.fake_engines import FakeSGLang
from tokentrail.errors import AuthenticationError, LogprobLengthError, RequestError
from tokentrail.integrations.slime import (
    CompatSample,
    TrajectoryManager,
    TurnRecord,
    anthropic,
    common,
    openai,
)
from tokentrail.integrations.slime.tree_view import MessageNodeView
from tokentrail.kinds import Fallback
from tokentrail.text.hf import as_loaded
from tokentrail.text.object_tokenizer import ObjectTokenizer
from tokentrail.trajectory.manager import TrajectoryManager as TrailManager
from tokentrail.trajectory.pipeline import TurnPipeline

SYS = {"role": "system", "content": "S"}
USER = {"role": "user", "content": "compute"}
TOOL = {"role": "tool", "content": "4"}
CALL = {"role": "assistant", "content": "call"}

# Token names: a message renders to [START, body, END] per role; the generation prompt is the
# assistant START, so a prompt plus its response is the next prompt's prefix.
START, END = {"system": 10, "user": 20, "assistant": 30, "tool": 40}, 9
GEN = START["assistant"]


def render(*messages: dict[str, Any], bodies: dict[str, int]) -> list[int]:
    out: list[int] = []
    for m in messages:
        out += [START[m["role"]], bodies[m["content"]], END]
    return [*out, GEN]


BODIES = {"S": 100, "compute": 101, "call": 102, "4": 103, "done": 104, "ok ": 105, "5": 106}


def record(mgr: TrajectoryManager, sid: str, prompt: list[dict], answer: str, **kw: Any) -> None:
    mgr.record_turn(
        sid,
        turn=TurnRecord(
            prompt_ids=render(*prompt, bodies=BODIES),
            output_ids=[BODIES[answer.strip()] if answer.strip() in BODIES else 199, END],
            finish_reason=kw.pop("finish_reason", "stop"),
            output_log_probs=kw.pop("logprobs", [-0.4, -0.1]),
        ),
        prompt_messages=prompt,
        response_message={"role": "assistant", "content": answer},
        **kw,
    )


# -- the `_trees` view -------------------------------------------------------------------------


def test_trees_view_is_slimes_node_shape_and_follows_the_tree() -> None:
    mgr = TrajectoryManager()
    record(mgr, "s", [SYS, USER], "call", finish_reason="tool_calls")
    record(mgr, "s", [SYS, USER, CALL, TOOL], "done")
    root = mgr._trees["s"]
    assert root.is_root and root.role is None and root.message is None and root.turn is None
    (leaf,) = [leaf for leaf in root.leaves() if not leaf.is_root]
    chain = leaf.path_from_root()
    assert [n.role for n in chain] == ["system", "user", "assistant", "tool", "assistant"]
    assert [n.message for n in chain[:2]] == [SYS, USER]
    first, last = chain[2], chain[4]
    assert first.turn_index == 1 and last.turn_index == 2
    assert isinstance(first.turn, TurnRecord)
    assert first.turn.prompt_ids == render(SYS, USER, bodies=BODIES)
    assert first.turn.output_ids == [BODIES["call"], END]
    assert first.turn.finish_reason == "tool_calls"
    assert first.turn.output_log_probs == pytest.approx([-0.4, -0.1])
    assert chain[3].turn is None and chain[3].turn_index is None  # routing-only
    assert last.parent == chain[3] and chain[0].parent == root

    # A third turn off the same assistant forks at the tool: the view shows it at once.
    record(mgr, "s", [SYS, USER, CALL, {"role": "tool", "content": "5"}], "done")
    assert len(mgr._trees["s"].children[0].children[0].children[0].children) == 2
    assert len([n for n in mgr._trees["s"].leaves() if not n.is_root]) == 2
    assert "s" in mgr._trees and list(mgr._trees) == ["s"]

    mgr.get_trajectory("s", base_sample=CompatSample(index=0))
    assert "s" not in mgr._trees and mgr._trees.get("s") is None


def test_trees_view_shows_a_merged_rewrite_as_slime_records_it() -> None:
    mgr = TrajectoryManager()
    record(mgr, "m", [SYS, USER], "ok", finish_reason="tool_calls")
    rewritten = {"role": "assistant", "content": "ok "}
    record(mgr, "m", [SYS, USER, rewritten, TOOL], "done")
    (leaf,) = [n for n in mgr._trees["m"].leaves() if not n.is_root]
    merged = leaf.path_from_root()[2]
    assert merged.turn is None and merged.turn_index is None
    assert merged.message == rewritten
    assert merged.metadata["merged_rewrite"] == {
        "abandoned_turn_index": 1,
        "abandoned_response_tokens": 2,
    }


def test_trees_view_is_read_only() -> None:
    mgr = TrajectoryManager()
    record(mgr, "r", [SYS, USER], "call")
    leaf = next(mgr._trees["r"].leaves())
    assert isinstance(leaf, MessageNodeView)
    with pytest.raises(AttributeError, match="read-only"):
        leaf.turn = dataclasses.replace(leaf.turn, output_log_probs=[0.0, 0.0])  # type: ignore[misc]
    with pytest.raises(TypeError):
        mgr._trees["r"] = leaf  # type: ignore[index]


# -- logprobs ------------------------------------------------------------------------------------


def test_logprob_length_mismatch_is_slimes_assertion_error() -> None:
    mgr = TrajectoryManager()
    with pytest.raises(AssertionError, match="output_log_probs") as info:
        record(mgr, "l", [SYS, USER], "call", logprobs=[-0.1])
    assert isinstance(info.value, LogprobLengthError)
    assert not mgr.has_session("l")


def test_logprobs_come_back_as_the_engine_gave_them() -> None:
    mgr = TrajectoryManager()
    record(mgr, "p", [SYS, USER], "call", finish_reason="tool_calls", logprobs=[-0.4, -0.1])
    record(mgr, "p", [SYS, USER, CALL, TOOL], "done", logprobs=[-0.3, -1e-7])
    (sample,) = mgr.get_trajectory("p", base_sample=CompatSample(index=0), reward=1.0)
    # float32 inside, the decimals given outside: -0.4 is -0.4, not -0.4000000059604645.
    assert sample.rollout_log_probs == [-0.4, -0.1, 0.0, 0.0, 0.0, 0.0, -0.3, -1e-7]


def test_slimes_common_prefix_helper() -> None:
    from tokentrail.integrations.slime.trajectory import _common_prefix_len

    assert _common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert _common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert _common_prefix_len([], [1]) == 0


# -- the adapter modules' helpers ----------------------------------------------------------------


def _params(fn: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_helpers_have_slimes_names_and_signatures() -> None:
    pos = inspect.Parameter.POSITIONAL_OR_KEYWORD
    kw = inspect.Parameter.KEYWORD_ONLY
    assert _params(anthropic._request_session_id) == [("request", pos)]
    assert _params(anthropic._translate_messages) == [("msgs", pos), ("system", pos)]
    assert _params(anthropic._tools_to_chat_tools) == [("anth_tools", pos)]
    assert _params(anthropic._fold_mid_list_system_into_user) == [("body_obj", pos)]
    assert _params(openai._request_session_id) == [("request", pos), ("body", pos)]
    assert _params(openai._translate_messages) == [("messages", pos)]
    assert _params(openai._tools_to_chat_tools) == [("tools", pos)]
    assert _params(common.flatten_content) == [("c", pos)]
    assert _params(common.call_sglang_generate) == [
        ("prompt_ids", pos),
        ("session", pos),
        ("body", pos),
        ("adapter", kw),
        ("session_id", kw),
    ]
    assert common.TurnRecord is TurnRecord
    assert anthropic.AnthropicAdapter.__name__ == "AnthropicAdapter"
    assert openai.OpenAIAdapter.__name__ == "OpenAIAdapter"


class _Request:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


def test_session_helpers_apply_tokentrails_rule() -> None:
    assert anthropic._request_session_id(_Request({"X-Api-Key": "key"})) == "key"
    assert anthropic._request_session_id(_Request({"Authorization": "Bearer b"})) == "b"
    with pytest.raises(RequestError, match="different sessions"):
        anthropic._request_session_id(_Request({"Authorization": "Bearer b", "X-Api-Key": "k"}))
    with pytest.raises(AuthenticationError):
        anthropic._request_session_id(_Request({}))
    assert openai._request_session_id(_Request({"Authorization": "Bearer b"}), {"user": "u"}) == "b"
    with pytest.raises(AuthenticationError):
        openai._request_session_id(_Request({}), {"metadata": {"session_id": "m"}})


def test_translation_helpers_are_the_adapters() -> None:
    call = {"type": "tool_use", "id": "u1", "name": "lookup", "input": {"q": "slime"}}
    translated = anthropic._translate_messages(
        [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan"}, call]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "r"}],
            },
        ],
        system="sys",
    )
    assert [m["role"] for m in translated] == ["system", "user", "assistant", "tool"]
    assert translated[2]["reasoning_content"] == "plan"
    assert translated[2]["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": {"q": "slime"},
    }
    assert translated[3]["content"] == "r"
    tools = anthropic._tools_to_chat_tools([{"name": "lookup", "input_schema": {"type": "object"}}])
    assert tools is not None and tools[0]["function"]["name"] == "lookup"
    assert anthropic._tools_to_chat_tools(None) is None

    chat = openai._translate_messages(
        [{"role": "developer", "content": "rules"}, {"role": "user", "content": "hello"}]
    )
    assert chat == [{"role": "system", "content": "rules"}, {"role": "user", "content": "hello"}]


def test_mid_list_system_folds_into_the_user_before_it() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "system", "content": "skills list"},
            {"role": "user", "content": "next"},
        ]
    }
    assert anthropic._fold_mid_list_system_into_user(body)
    assert [m["role"] for m in body["messages"]] == ["user", "user"]
    reminder = "<system-reminder>\nskills list\n</system-reminder>\n"  # slime's text
    assert body["messages"][0]["content"][-1] == {"type": "text", "text": reminder}
    assert not anthropic._fold_mid_list_system_into_user(body)


def test_flatten_content_reads_blocks_as_text() -> None:
    assert common.flatten_content(None) == ""
    assert common.flatten_content("x") == "x"
    blocks = [
        {"type": "text", "text": "a"},
        {"type": "image", "source": {}},
        {"type": "tool_result", "content": [{"type": "text", "text": "b"}]},
    ]
    assert common.flatten_content(blocks) == "a\n[image omitted]\nb"


# -- a tokenizer object without a `tokenizers` backend ------------------------------------------


class WordTokenizer:
    """A word-level tokenizer object with no `tokenizers` backend: `apply_chat_template` returns
    ids ([ROLE, *words, END] per message, then the assistant ROLE), `decode` joins words."""

    ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
    END = 5

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.words: dict[int, str] = {}
        self.rendered: list[list[dict[str, Any]]] = []

    def encode(self, text: str) -> list[int]:
        for w in text.split():
            if w not in self.vocab:
                self.vocab[w] = 100 + len(self.vocab)
                self.words[self.vocab[w]] = w
        return [self.vocab[w] for w in text.split()]

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return " ".join(self.words[i] for i in ids if i in self.words)

    def apply_chat_template(
        self, messages: Any, tools: Any = None, tokenize: bool = True, add_generation_prompt=True
    ) -> list[int]:
        self.rendered.append(list(messages))
        out: list[int] = []
        for m in messages:
            out += [self.ROLES[m["role"]], *self.encode(str(m.get("content") or "")), self.END]
        return [*out, self.ROLES["assistant"]] if add_generation_prompt else out


def test_a_tokenizer_object_is_used_through_its_own_methods(caplog) -> None:
    tok = WordTokenizer()
    with caplog.at_level(logging.WARNING, logger="tokentrail.text.object_tokenizer"):
        loaded = as_loaded(tok)
    assert isinstance(loaded, ObjectTokenizer) and as_loaded(tok) is loaded
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "not a fast tokenizer" in warning
    assert "incremental encoding" in warning and "fast path" in warning
    assert loaded.encode("a b a") == [100, 101, 100]
    assert loaded.decode([101, 100]) == "b a"
    assert loaded.end_token_ids == frozenset()

    pipeline = TurnPipeline(TrailManager(), tok, tool_parser=None, reasoning_parser=None)
    from tokentrail.messages import Conversation

    convo = Conversation([{"role": "user", "content": "hi there"}], None)
    prepared = pipeline.prepare("w", convo)
    assert prepared.prompt_ids.tolist() == tok.apply_chat_template(convo.messages)
    assert prepared.fallback is Fallback.REFERENCE_TOKENIZER
    assert pipeline.count_tokens(convo) == len(prepared.prompt_ids)
    prefill = Conversation([*convo.messages, {"role": "assistant", "content": "so"}], None)
    with pytest.raises(RequestError, match="prefill needs a fast tokenizer"):
        pipeline.prepare("w", prefill)


def test_the_drop_in_serves_a_tokenizer_object_and_the_ledger_says_so() -> None:
    tok = WordTokenizer()
    answers = iter(["let me look", "the fix is done"])

    def reply(input_ids: list[int]) -> tuple[list[int], list[float], str]:
        ids = tok.encode(next(answers))
        return ids, [-0.5] * len(ids), "stop"

    async def run() -> tuple[list[Any], FakeSGLang]:
        async with FakeSGLang(reply=reply) as sglang:
            adapter = anthropic.AnthropicAdapter(tokenizer=tok, sglang_url=sglang.url)
            adapter.open_session("w")
            client = TestClient(TestServer(adapter.app))
            await client.start_server()
            history: list[dict[str, Any]] = [{"role": "user", "content": "solve it"}]
            try:
                for _ in range(2):
                    resp = await client.post(
                        "/v1/messages",
                        headers={"Authorization": "Bearer w"},
                        json={"model": "m", "max_tokens": 16, "messages": history},
                    )
                    assert resp.status == 200, await resp.text()
                    data = await resp.json()
                    history += [
                        {"role": "assistant", "content": data["content"]},
                        {"role": "user", "content": "continue"},
                    ]
            finally:
                await client.close()
            samples = await adapter.finish_session("w", base_sample=CompatSample(index=0))
            return samples, sglang

    samples, sglang = asyncio.run(run())
    bodies = sglang.bodies("/generate")
    # The prompts are the object's own ids for the conversation, every turn rendered in full.
    assert [b["input_ids"] for b in bodies] == [
        tok.apply_chat_template([{"role": "user", "content": "solve it"}]),
        tok.apply_chat_template(
            [
                {"role": "user", "content": "solve it"},
                {"role": "assistant", "content": "let me look"},
                {"role": "user", "content": "continue"},
            ]
        ),
    ]
    (sample,) = samples
    assert sample.response.endswith("the fix is done")
    ledger = sample.metadata["ledger"]
    assert [e["fallback"] for e in ledger] == [Fallback.REFERENCE_TOKENIZER.value] * 2


def test_every_drop_in_turn_goes_through_call_sglang_generate(monkeypatch) -> None:
    """slime's tests script the model by replacing `common.call_sglang_generate`: the drop-in
    adapter looks it up at every turn, as slime's does."""
    tok = WordTokenizer()
    seen: list[tuple[list[int], str | None]] = []

    async def scripted(prompt_ids, session, body, *, adapter, session_id=None) -> TurnRecord:
        seen.append((list(prompt_ids), session_id))
        ids = tok.encode("scripted answer")
        return TurnRecord(prompt_ids, ids, "stop", [-0.25] * len(ids))

    monkeypatch.setattr(common, "call_sglang_generate", scripted)

    async def run() -> tuple[dict[str, Any], list[Any]]:
        adapter = openai.OpenAIAdapter(tokenizer=tok, sglang_url="http://127.0.0.1:1")
        adapter.open_session("o")
        client = TestClient(TestServer(adapter.app))
        await client.start_server()
        try:
            resp = await client.post(
                "/v1/chat/completions",
                headers={"Authorization": "Bearer o"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            data = await resp.json()
        finally:
            await client.close()
        return data, await adapter.finish_session("o", base_sample=CompatSample(index=0))

    data, samples = asyncio.run(run())
    assert data["choices"][0]["message"]["content"] == "scripted answer"
    assert seen == [(tok.apply_chat_template([{"role": "user", "content": "hi"}]), "o")]
    assert samples[0].rollout_log_probs[-2:] == [-0.25, -0.25]


def test_a_tokenizer_object_returning_an_encoding_gives_its_input_ids() -> None:
    """`transformers` returns a `BatchEncoding` (a mapping) when asked for a dict."""

    class EncodingTokenizer(WordTokenizer):
        def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
            return {"input_ids": super().apply_chat_template(messages, **kwargs), "mask": []}

    tok = EncodingTokenizer()
    loaded = as_loaded(tok)
    assert isinstance(loaded, ObjectTokenizer)
    ids = loaded.render_ids([{"role": "user", "content": "a b"}])
    assert ids == [2, 100, 101, 5, 3]
    assert loaded.render_chat([{"role": "user", "content": "a b"}]) == "a b"
