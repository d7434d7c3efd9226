"""Images in the journal: each image's bytes stored once per journal (the `images` table), its
turns' tags naming it by digest, and joined back wherever a session is read, so recovered,
replayed and exported samples carry the very bytes the harness sent. Through the real adapter,
Anthropic SDK and Qwen3-VL vocabulary; a writer SIGKILLed after acknowledging a turn; a
schema-2 journal (tags with inline bytes) as the release before wrote it; compaction; a
damaged image.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest

from support.images import image_block, png
from tokentrail.adapter import Adapter, start_server
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.kinds import JournalEvent
from tokentrail.storage.export import read_samples
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.compact import compact, export_finished
from tokentrail.storage.journal.format import ROW_COLUMNS, Row
from tokentrail.storage.journal.read import check_journal, read_journal
from tokentrail.storage.replay import as_recorded
from tokentrail.text.tokenizer import load_tokenizer
from tokentrail.trajectory.tree import iter_nodes

SUPPORT = Path(__file__).parent / "support"


def digest_of(data: bytes) -> str:
    """The adapter's digest of an image sent as base64 (`ImageSource.of_base64`)."""
    return hashlib.sha256(base64.b64encode(data)).hexdigest()


@pytest.fixture(scope="module")
def qwen3_vl():
    return load_tokenizer("builtin:qwen3-vl")


async def converse(url: str, sid: str, images: list[bytes | None]) -> None:
    """One harness session: a user message per step (with its image, if any), every earlier
    message (and so every earlier image) sent again."""
    client = anthropic.AsyncAnthropic(base_url=url, api_key=sid, max_retries=0)
    messages: list[dict[str, Any]] = []
    for k, image in enumerate(images):
        content: list[dict[str, Any]] = [{"type": "text", "text": f"{sid} step {k}"}]
        if image is not None:
            content.append(image_block(image))
        messages.append({"role": "user", "content": content})
        reply = await client.messages.create(
            model="m", max_tokens=16, messages=messages, extra_headers={"X-Session-Id": sid}
        )
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})


def serve(
    tokenizer,
    journal: Journal,
    sessions: dict[str, list[bytes | None]],
    finish: frozenset[str] | None = None,
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Serve `sessions` one after the other, finishing those in `finish` (None: all); each
    finished session's trajectory, and each session's turns' tags in the tree."""
    turns = sum(len(v) for v in sessions.values())
    script = [[{"type": "text", "text": f"seen {k}"}] for k in range(turns)]
    adapter = Adapter(
        engine=ScriptedEngine(tokenizer, script), tokenizer=tokenizer, journal=journal
    )

    async def go() -> tuple[dict[str, Any], dict[str, list[Any]]]:
        runner, url = await start_server(adapter)
        try:
            tags: dict[str, list[Any]] = {}
            out = {}
            for sid, images in sessions.items():
                await converse(url, sid, images)
                root = adapter.manager.root(sid)
                tags[sid] = [n.metadata for n in iter_nodes(root) if n.turn is not None]
                if finish is None or sid in finish:
                    out[sid] = await adapter.finish_trajectory(sid, reward=1.0)
            return out, tags
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def stored_tags(path: Path) -> list[dict[str, Any]]:
    """Every turn's tags as the file holds them (before any join)."""
    db = sqlite3.connect(path)
    try:
        rows = [Row(*v) for v in db.execute(f"SELECT {ROW_COLUMNS} FROM events ORDER BY seq")]
    finally:
        db.close()
    return [r.data()["metadata"] for r in rows if r.kind == JournalEvent.TURN]


def image_rows(path: Path) -> dict[str, bytes]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT digest, data FROM images").fetchall())
    finally:
        db.close()


def test_images_survive_journal_read_replay_and_export(qwen3_vl, tmp_path: Path) -> None:
    first, second = png(200, 150, seed=1), png(120, 90, seed=2)
    path = tmp_path / "run.db"
    journal = Journal(path)
    try:
        trajectory, _ = serve(qwen3_vl, journal, {"s": [first, None, second, None]})
    finally:
        journal.close()
    live = trajectory["s"].samples[-1]
    assert live.multimodal_inputs()["images"] == [first, second]
    # Stored once each, by digest; no turn's tags hold bytes, each names its prompt's images.
    assert image_rows(path) == {digest_of(first): first, digest_of(second): second}
    named = [[i["digest"] for i in tags["images"]] for tags in stored_tags(path)]
    assert named == [[digest_of(first)]] * 2 + [[digest_of(first), digest_of(second)]] * 2
    assert not any("data" in i for tags in stored_tags(path) for i in tags["images"])
    # Read back: every turn's tags as the pipeline made them, bytes included, one text each.
    (record,) = read_journal(path).records()
    texts = [i["data"] for turn in record.turns for i in turn.metadata["images"]]
    assert [base64.b64decode(t) for t in texts] == [first, first, first, second, first, second]
    assert len({id(t) for t in texts}) == 2
    # Replayed and exported: the sample the live session answered, byte for byte.
    (replayed,) = as_recorded(read_journal(path)).values()
    assert replayed.samples[-1].metadata == live.metadata
    out = tmp_path / "samples.jsonl"
    assert export_finished(path, out).samples == len(trajectory["s"].samples)
    back = read_samples(out)[-1]
    assert back.metadata == live.metadata
    assert back.multimodal_inputs()["images"] == [first, second]
    assert back.multimodal_inputs()["image_offsets"] == live.multimodal_inputs()["image_offsets"]
    assert check_journal(path).ok


def test_a_20_turn_session_stores_its_500kb_image_once(qwen3_vl, tmp_path: Path) -> None:
    shot = png(416, 400, seed=3)
    assert len(shot) > 500_000
    path = tmp_path / "run.db"
    journal = Journal(path)
    try:
        _, tags = serve(qwen3_vl, journal, {"s": [shot] + [None] * 19}, finish=frozenset())
    finally:
        journal.close()
    assert image_rows(path) == {digest_of(shot): shot}
    # The whole file (every turn's prompt resends the image) holds about one copy of it.
    size = sum(p.stat().st_size for p in tmp_path.iterdir() if p.name.startswith("run.db"))
    assert size < len(shot) + 200_000, size
    # In memory: the 20 turns' tags share one base64 text of it.
    texts = [i["data"] for t in tags["s"] for i in t["images"]]
    assert len(texts) == 20 and len({id(t) for t in texts}) == 1
    assert base64.b64decode(texts[0]) == shot


# A journal writer to SIGKILL: turn k of session "s" holds the first image, from turn 2 on
# also the second; `ack k` is printed once turn k is committed.
WRITER = """
import base64, hashlib, pathlib, sys, time
from tokentrail.storage.journal import Journal
from tokentrail.storage.journal.record import JournaledTurn

images = [pathlib.Path(p).read_bytes() for p in sys.argv[2:]]
journal = Journal(sys.argv[1])

def tag(data, offset):
    text = base64.b64encode(data).decode()
    return {"digest": hashlib.sha256(text.encode()).hexdigest(), "media_type": "image/png",
            "width": 8, "height": 8, "image_grid_thw": [1, 2, 2], "tokens": 1,
            "offset": offset, "data": text}

prompt = []
for k in range(200):
    prompt = prompt + [k + 10] * 50
    held = images[:1] if k < 2 else images
    tags = [tag(d, 3 + j) for j, d in enumerate(held)]
    journal.turn(JournaledTurn("s", translated=[{"role": "user", "content": f"step {k}"}],
                 response_message={"role": "assistant", "content": "ok"}, tools=None,
                 prompt_ids=prompt, output_ids=[7, 8], logprobs=None, finish_reason="stop",
                 ill_formed=False, metadata={"images": tags}))
    print(f"ack {k}", flush=True)
    if k >= 3:
        time.sleep(0.05)
"""


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
@pytest.mark.parametrize("after", [0, 2, 5])
def test_a_writer_killed_after_a_turn_is_acknowledged_keeps_its_images(
    tmp_path: Path, after: int
) -> None:
    first, second = png(300, 200, seed=4), png(100, 100, seed=5)
    path = tmp_path / "run.db"
    files = [tmp_path / "first.png", tmp_path / "second.png"]
    for file, data in zip(files, (first, second), strict=True):
        file.write_bytes(data)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), *map(str, files)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert child.stdout is not None
    try:
        for line in child.stdout:
            if line.strip() == f"ack {after}":
                child.send_signal(signal.SIGKILL)
                break
    finally:
        child.kill()
        child.wait()
    journal = Journal(path)
    try:
        assert journal.recovery.clean
        events = [e for e in journal.live_events() if e.kind is JournalEvent.TURN]
    finally:
        journal.close()
    # Every acknowledged turn is there, and every turn there has its images' very bytes.
    assert len(events) > after
    for event in events:
        assert event.turn is not None
        held = [base64.b64decode(i["data"]) for i in event.turn.metadata["images"]]
        assert held == ([first] if event.seq <= 2 else [first, second])
    assert len(image_rows(path)) == (1 if len(events) <= 2 else 2)
    assert check_journal(path).ok


def test_a_schema_2_journal_with_inline_images_is_read_and_upgraded(
    qwen3_vl, tmp_path: Path
) -> None:
    """`support/journal_v2_images.db` was written by the release before schema 3
    (`support/make_journal_v2_images.py`): its turns' tags carry their images' bytes."""
    path = tmp_path / "old.db"
    shutil.copyfile(SUPPORT / "journal_v2_images.db", path)
    expected = json.loads((SUPPORT / "journal_v2_images.expected.json").read_text())
    assert read_journal(path).version == 2
    assert all("data" in i for tags in stored_tags(path) for i in tags.get("images", ()))
    # Read as it is: the samples that release answered, images and all.
    finished = as_recorded(read_journal(path))["job-0"]
    assert [s.to_dict() for s in finished.samples] == expected["job-0"]["samples"]
    (image,) = [i for i in finished.samples[-1].metadata["images"] if i["width"] == 64]
    first = base64.b64decode(image["data"])
    assert digest_of(first) == image["digest"]
    # Opened to append: upgraded in place; its old turns still read, a new turn resending
    # the old image stores it in `images`, and the session finishes with it.
    journal = Journal(path)
    try:
        assert journal.recovery.migrated_from == 2 and journal.recovery.live == ["job-1"]
        assert journal.meta()["schema_version"] == "3"
        adapter = Adapter(engine=ScriptedEngine(qwen3_vl), tokenizer=qwen3_vl, journal=journal)
        trajectory = asyncio.run(adapter.finish_trajectory("job-1", reward=0.5))
    finally:
        journal.close()
    assert trajectory.samples[-1].multimodal_inputs()["images"] == [first]
    assert read_journal(path).version == 3 and check_journal(path).ok
    journal = Journal(path)
    try:
        _, tags = serve(qwen3_vl, journal, {"job-2": [first, None]})
    finally:
        journal.close()
    assert image_rows(path) == {digest_of(first): first}
    after = as_recorded(read_journal(path))
    assert [s.to_dict() for s in after["job-0"].samples] == expected["job-0"]["samples"]
    assert after["job-2"].samples[-1].multimodal_inputs()["images"] == [first]


def test_compaction_keeps_the_images_kept_turns_name(qwen3_vl, tmp_path: Path) -> None:
    shared, gone, kept = png(160, 120, seed=6), png(150, 110, seed=7), png(140, 100, seed=8)
    path = tmp_path / "run.db"
    journal = Journal(path)
    try:
        sessions = {"done": [shared, gone], "open": [shared, kept, None]}
        serve(qwen3_vl, journal, sessions, finish=frozenset({"done"}))
    finally:
        journal.close()
    assert set(image_rows(path)) == {digest_of(i) for i in (shared, gone, kept)}
    result = compact(path)
    assert result.sessions_removed == 1 and result.bytes_after < result.bytes_before
    assert image_rows(path) == {digest_of(shared): shared, digest_of(kept): kept}
    (record,) = read_journal(path).records()
    assert record.damage is None
    held = [[base64.b64decode(i["data"]) for i in t.metadata["images"]] for t in record.turns]
    assert held == [[shared], [shared, kept], [shared, kept]]


def test_a_damaged_image_damages_the_turns_naming_it_not_their_samples(
    qwen3_vl, tmp_path: Path
) -> None:
    clean, hurt = png(120, 90, seed=9), png(110, 80, seed=10)
    path = tmp_path / "run.db"
    journal = Journal(path)
    try:
        serve(qwen3_vl, journal, {"s": [clean, None, hurt, None]}, finish=frozenset())
    finally:
        journal.close()
    db = sqlite3.connect(path)
    flipped = hurt[:100] + bytes(b ^ 0xFF for b in hurt[100:164]) + hurt[164:]
    db.execute("UPDATE images SET data = ? WHERE digest = ?", (flipped, digest_of(hurt)))
    db.commit()
    db.close()
    report = check_journal(path)
    assert report.bad_images == 1 and not report.ok
    (record,) = read_journal(path).records()
    # The session stops at the first turn naming it: the turns before it are whole.
    assert len(record.turns) == 2
    assert "image" in (record.damage or "") and "checksum mismatch" in (record.damage or "")
    assert all(
        base64.b64decode(i["data"]) == clean for t in record.turns for i in t.metadata["images"]
    )
