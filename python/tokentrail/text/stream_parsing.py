"""Output parsing as tokens arrive: sampled ids decoded piece by piece, and the text told apart
into reasoning and content while the model writes it, for streaming to a harness.

`StreamDecoder` turns runs of ids into text deltas whose concatenation equals
`LoadedTokenizer.decode_turn` of all of them (a partial UTF-8 character, and end-of-turn tokens
that may still close the turn, wait). `StreamParser` hands out only what no continuation can
change in the whole parse (`parsing.parse_output`): it holds back a suffix that may still become
markup (a partial `<think>`, `</think>` or the tool format's call start) and the newlines a
format strips at the edges. Tool calls go out as `text.stream_calls` reads them: as sampled
(each call's name, then fragments of its arguments' JSON), call by call, or, for formats it
cannot read, with the whole parse at the end. For a well-formed output, the reasoning, content
and call arguments handed out, plus what `finish` adds, equal the whole parse's.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokentrail.messages import Message
from tokentrail.text import formats
from tokentrail.text.formats.base import MessageFormat, ToolFormat, ToolSchemas, strip_newlines
from tokentrail.text.formats.reasoning import THINK_CLOSE, THINK_OPEN, ThinkTags
from tokentrail.text.stream_calls import CallDelta, CallsReader, arguments_text, calls_reader
from tokentrail.text.tokenizer import LoadedTokenizer

__all__ = ["CallDelta", "StreamDecoder", "StreamDeltas", "StreamParser"]

# `StreamDecoder` decodes each run with the tokens before it back to the start of its window
# (context for a token whose text depends on the one before: byte-level pieces), and keeps the
# text of the window so far, so that a run costs one decode (`tokenizers` pays tens of us a
# call on a cold cache, whatever its length). A window past `WINDOW_TOKENS` starts again
# `CONTEXT_TOKENS` back.
CONTEXT_TOKENS = 4
WINDOW_TOKENS = 48


class StreamDecoder:
    """Text deltas of a turn's ids as they arrive; all of them together equal
    `tokenizer.decode_turn(ids)`."""

    def __init__(self, tokenizer: LoadedTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        # Decoded up to `read` (ids); `prefix` starts the window decoded with it, so a token
        # whose text depends on the one before (byte-level pieces) decodes as in the whole;
        # `before` is the text of the window up to `read`.
        self.prefix = 0
        self.read = 0
        self.before = ""

    def feed(self, ids: Sequence[int]) -> str:
        self.ids.extend(map(int, ids))
        end = len(self.ids)
        # End-of-turn tokens at the end may close the turn (`decode_turn` drops them): wait.
        while end > self.read and self.ids[end - 1] in self.tokenizer.end_token_ids:
            end -= 1
        return self._advance(end, finished=False)

    def _advance(self, end: int, finished: bool) -> str:
        if end <= self.read:
            return ""
        if self.read - self.prefix > WINDOW_TOKENS:
            self.prefix = self.read - CONTEXT_TOKENS
            self.before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        before = self.before
        text = self.tokenizer.decode(self.ids[self.prefix : end])
        if not finished and (text.endswith("\ufffd") or not text.startswith(before)):
            return ""  # a character not complete yet
        self.read, self.before = end, text
        return text[len(before) :]

    def finish(self) -> str:
        """What is left once the turn is over (a character cut short by the end)."""
        end = len(self.ids)
        while end > self.read and self.ids[end - 1] in self.tokenizer.end_token_ids:
            end -= 1
        return self._advance(end, finished=True)


@dataclass
class StreamDeltas:
    """What one step hands out: more reasoning, then more content, then more of the calls."""

    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class _Phase(enum.Enum):
    START = "start"  # nothing but whitespace yet: a `<think>` may still open
    REASONING = "reasoning"  # inside a `<think>` the model opened
    OPENED = "opened"  # no `<think>`: a `</think>` may still make all so far reasoning
    AFTER_REASONING = "after_reasoning"  # the newlines after `</think>` a format strips
    BODY = "body"  # content, up to a call start
    CALLS = "calls"  # tool calls: read by the format's `CallsReader`, if it has one
    HELD = "held"  # a format read as a whole: nothing until the end


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


@dataclass
class StreamParser:
    """Reasoning and content told apart as text arrives (see the module docstring).

    `tool_parser` and `reasoning_parser` are the names `parse_output` takes (None: no such
    markup). A reasoning format other than `<think>` tags, or a tool format that reads the
    whole output itself or finds calls by more than its call start, streams nothing until the
    end.
    """

    tool_parser: str | None
    reasoning_parser: str | None
    # Whether the prompt may have opened the reasoning block (its generation prompt ends with
    # `<think>`). When it cannot have (a family whose prompt never does), output that does not
    # open a block itself is content from its first token; only a stray `</think>` in it
    # (which the whole parse reads as the end of reasoning) then makes `finish` report a
    # mismatch. When it may have, that content waits for `</think>`, `<think>`, a call start
    # or the end.
    prompt_opens: bool = True
    # The request's tool schemas (XML formats type parameter values by them).
    tools: ToolSchemas = None
    text: str = ""
    sent_reasoning: list[str] = field(default_factory=list)
    sent_content: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tool: ToolFormat | None = (
            None if self.tool_parser is None else formats.tool_format(self.tool_parser)
        )
        reasoning = (
            None
            if self.reasoning_parser is None
            else formats.reasoning_format(self.reasoning_parser)
        )
        self.think: ThinkTags | None = reasoning if isinstance(reasoning, ThinkTags) else None
        self.phase = _Phase.START if reasoning is not None else _Phase.BODY
        live_tool = self.tool is None or (
            not isinstance(self.tool, MessageFormat)
            and type(self.tool).has_calls is ToolFormat.has_calls
        )
        if (reasoning is not None and self.think is None) or not live_tool:
            self.phase = _Phase.HELD
        self.call_start = self.tool.call_start if self.tool is not None else None
        # Positions in `text`: where reasoning and content start, how far each was handed out,
        # and from where the next search for markup starts.
        self.r_start = self.r_sent = 0
        self.c_start = self.c_sent = 0
        self.scan = 0
        self.lead_fixed = False
        self.seen_open = self.seen_call = False
        self.calls: CallsReader | None = None
        # Each call's name and the arguments text handed out, by call index.
        self.sent_calls: list[tuple[str, list[str]]] = []

    # -- feeding --------------------------------------------------------------------------------

    def feed(self, delta: str) -> StreamDeltas:
        self.text += delta
        out = StreamDeltas()
        while True:
            phase = self.phase
            self._step(out)
            if self.phase is phase:
                break
        if out.reasoning:
            self.sent_reasoning.append(out.reasoning)
        if out.content:
            self.sent_content.append(out.content)
        for call in out.calls:
            if call.name:
                self.sent_calls.append((call.name, []))
            self.sent_calls[call.index][1].append(call.arguments)
        return out

    def _step(self, out: StreamDeltas) -> None:
        t = self.text
        if self.phase is _Phase.START:
            s = t.lstrip()
            if s.startswith(THINK_OPEN):
                self.r_start = self.r_sent = t.index(THINK_OPEN) + len(THINK_OPEN)
                self.scan = self.r_start
                self.phase = _Phase.REASONING
            elif not THINK_OPEN.startswith(s):
                self.phase = _Phase.OPENED if self.prompt_opens else _Phase.BODY
        elif self.phase is _Phase.REASONING:
            self._reasoning(out)
        elif self.phase is _Phase.OPENED:
            self._opened(out)
        elif self.phase is _Phase.AFTER_REASONING:
            assert self.think is not None
            after = self.think.after
            pos = self.c_start
            while pos < len(t) and pos - self.c_start < after and t[pos] == "\n":
                pos += 1
            if pos - self.c_start == after or pos < len(t):
                self.c_start = self.c_sent = pos
                self.scan = pos
                self.phase = _Phase.BODY
        elif self.phase is _Phase.BODY:
            self._body(out)
        elif self.phase is _Phase.CALLS and self.calls is not None:
            out.calls.extend(self.calls.feed(t))

    def _reasoning(self, out: StreamDeltas) -> None:
        assert self.think is not None
        t = self.text
        lead, trail = self.think.inner
        end = t.find(THINK_CLOSE, self.scan)
        stop = end if end >= 0 else len(t) - _partial_suffix(t, THINK_CLOSE)
        self.scan = max(self.r_start, len(t) - len(THINK_CLOSE))
        if not self.lead_fixed:
            pos = self.r_start
            while pos < stop and pos - self.r_start < lead and t[pos] == "\n":
                pos += 1
            if pos - self.r_start == lead or pos < stop or end >= 0:
                self.r_start = self.r_sent = pos
                self.lead_fixed = True
            else:
                return
        cut = stop
        while stop - cut < trail and cut > self.r_start and t[cut - 1] == "\n":
            cut -= 1
        if cut > self.r_sent:
            out.reasoning += t[self.r_sent : cut]
            self.r_sent = cut
        if end >= 0:
            self.c_start = end + len(THINK_CLOSE)
            self.phase = _Phase.AFTER_REASONING

    def _opened(self, out: StreamDeltas) -> None:
        """No `<think>` opened the output: a first `</think>` with neither `<think>` nor a call
        start before it makes all before it reasoning (the prompt opened the block)."""
        assert self.think is not None
        t = self.text
        window = t[self.scan :]
        close = window.find(THINK_CLOSE)
        before = window if close < 0 else window[:close]
        self.seen_open = self.seen_open or THINK_OPEN in before
        self.seen_call = self.seen_call or bool(self.call_start and self.call_start in before)
        if self.seen_open or self.seen_call:
            self.phase = _Phase.BODY  # no `</think>` can make this reasoning any more
            self.c_start = self.c_sent = self.scan = 0
            return
        if close < 0:
            longest = max(len(THINK_OPEN), len(THINK_CLOSE), len(self.call_start or ""))
            self.scan = max(0, len(t) - longest)
            return
        end = self.scan + close
        lead, trail = self.think.inner
        out.reasoning += strip_newlines(t[:end], lead, trail)
        self.c_start = end + len(THINK_CLOSE)
        self.phase = _Phase.AFTER_REASONING

    def _body(self, out: StreamDeltas) -> None:
        t = self.text
        if self.call_start is None:
            if len(t) > self.c_sent:
                out.content += t[self.c_sent :]
                self.c_sent = len(t)
            return
        first = t.find(self.call_start, max(self.c_start, self.scan))
        stop = first if first >= 0 else len(t) - _partial_suffix(t, self.call_start)
        self.scan = max(self.c_start, len(t) - len(self.call_start))
        cut = stop
        # Formats strip the newlines between content and their first call.
        while cut > self.c_sent and t[cut - 1] == "\n":
            cut -= 1
        reader = None
        if first >= 0 and self.tool_parser is not None:
            reader = calls_reader(self.tool_parser, first, self.tools)
        if reader is not None:
            # The calls go out now, so the content must be whole first: the format strips
            # only so many of those newlines.
            cut = first
            kept = reader.content_newlines
            while first - cut < kept and cut > self.c_start and t[cut - 1] == "\n":
                cut -= 1
        if cut > self.c_sent:
            out.content += t[self.c_sent : cut]
            self.c_sent = cut
        if first >= 0:
            self.calls = reader
            self.phase = _Phase.CALLS

    # -- the end --------------------------------------------------------------------------------

    def finish(self, message: Message) -> tuple[StreamDeltas, bool]:
        """What is left to hand out once the whole parse gave `message`, and whether what was
        handed out is a prefix of it (false only for output the whole parse calls ill-formed,
        or a family's rewrite of it)."""
        reasoning = message.get("reasoning_content") or ""
        content = message.get("content")
        content = content if isinstance(content, str) else ""
        sent_r = "".join(self.sent_reasoning)
        sent_c = "".join(self.sent_content)
        ok = reasoning.startswith(sent_r) and content.startswith(sent_c)
        if sent_c and reasoning != sent_r:
            ok = False  # reasoning cannot grow once content went out
        rest = StreamDeltas(
            reasoning[len(sent_r) :] if ok and not sent_c else "",
            content[len(sent_c) :] if ok else "",
        )
        calls = message.get("tool_calls") or []
        if (self.sent_calls and (sent_c != content or reasoning != sent_r)) or len(
            self.sent_calls
        ) > len(calls):
            ok = False  # text cannot come after calls went out
        for index, call in enumerate(calls):
            name = call["function"]["name"]
            arguments = arguments_text(call["function"]["arguments"])
            if index >= len(self.sent_calls):
                rest.calls.append(CallDelta(index, name, arguments))
                continue
            sent_name, fragments = self.sent_calls[index]
            sent = "".join(fragments)
            if sent_name != name or not arguments.startswith(sent):
                ok = False  # a call the whole parse reads otherwise: it stays as it went out
            elif len(arguments) > len(sent):
                rest.calls.append(CallDelta(index, "", arguments[len(sent) :]))
        return rest, ok
