"""Exported samples in the viewer (`tokentrail view done.jsonl`, .npz or .parquet): sessions by
their samples' `session_id`, each sample's tokens coloured prompt, trained or not trained.

A sample file carries no ledger and no tree: a response token its loss mask leaves out may be a
tool result the harness sent or a generated token that was masked, and the file does not say
which, nor why. The page says so; the journal the samples came from says it all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokentrail.errors import NotFound
from tokentrail.storage.export import read_samples
from tokentrail.text.tokenizer import LoadedTokenizer
from tokentrail.trajectory.sample import Sample
from tokentrail.view.sources import token_text
from tokentrail.view.view_model import Decode, sample_row

__all__ = ["SAMPLE_FATES", "SamplesSource", "is_sample_file"]

# A sample's response tokens: trained, or left out by its loss mask (a reason is not recorded).
SAMPLE_FATES = ("trained", "not_trained")
_SUFFIXES = (".jsonl", ".npz", ".parquet")


def is_sample_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in _SUFFIXES


class SamplesSource:
    """The samples of one file, read once."""

    def __init__(self, path: str | Path, tokenizer: LoadedTokenizer | None = None) -> None:
        self.path = Path(path)
        self._tokenizer_name = tokenizer.name if tokenizer else None
        self._decode: Decode | None = token_text(tokenizer) if tokenizer else None
        self._sessions: dict[str, list[Sample]] = {}
        for sample in read_samples(self.path):
            sid = str(sample.metadata.get("session_id", "(no session id)"))
            self._sessions.setdefault(sid, []).append(sample)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "samples",
            "path": str(self.path),
            "tokenizer": self._tokenizer_name,
            "text": self._decode is not None,
        }

    def _get(self, sid: str) -> list[Sample]:
        found = self._sessions.get(sid)
        if found is None:
            raise NotFound(f"no session {sid!r} in {self.path}")
        return found

    def summaries(self) -> list[dict[str, Any]]:
        return [_summary(sid, samples) for sid, samples in self._sessions.items()]

    def detail(self, sid: str) -> dict[str, Any]:
        samples = self._get(sid)
        rows = [sample_row(i, s) for i, s in enumerate(samples)]
        return {**_summary(sid, samples), "ledger": None, "sample_list": rows}

    def turn(self, sid: str, turn_index: int) -> dict[str, Any]:
        """Sample number `turn_index` of the session, shaped as a turn page."""
        samples = self._get(sid)
        if not 0 <= turn_index < len(samples):
            raise NotFound(f"session {sid!r} has {len(samples)} samples, no sample {turn_index}")
        return sample_detail(samples[turn_index], turn_index, self._decode)


def _summary(sid: str, samples: Sequence[Sample]) -> dict[str, Any]:
    turns = {t for s in samples for t in s.metadata.get("turns", [])}
    return {
        "sid": sid,
        "state": "exported",
        "turns": len(turns),
        "samples": len(samples),
        # Not in the file: what was generated, and why anything was masked.
        "generated": None,
        "trained": sum(s.trained_tokens for s in samples),
        "masked": {},
        "response_tokens": sum(s.response_length for s in samples),
    }


def sample_detail(sample: Sample, index: int, decode: Decode | None) -> dict[str, Any]:
    start = sample.prompt_length
    prompt = sample.tokens[:start].tolist()
    response = sample.tokens[start:].tolist()
    fates = np.where(sample.loss_mask.astype(bool), 0, 1).astype(np.uint8)
    versions = sorted({str(v["version"]) for v in sample.metadata.get("weight_versions", [])})
    version_of = np.full(len(response), -1, dtype=np.int32)
    for v in sample.metadata.get("weight_versions", []):
        version_of[max(0, v["start"] - start) : max(0, v["end"] - start)] = versions.index(
            str(v["version"])
        )
    trained = sample.trained_tokens
    return {
        "turn_index": index,
        "sample": True,
        "tools": [],
        "finish_reason": sample.metadata.get("finish_reason"),
        "generated": sample.response_length,
        "trained": trained,
        "masked": {},
        "history": None,
        "excluded": None,
        "superseded": False,
        "prompt": {
            "length": len(prompt),
            "shared": 0,
            "previous_turn": None,
            "ids": prompt,
            "text": decode(prompt) if decode else None,
        },
        "output": {
            "ids": response,
            "text": decode(response) if decode else None,
            "logprobs": np.round(sample.rollout_log_probs.astype(float), 4).tolist(),
            "fates": fates.tolist(),
            "versions": versions,
            "version": version_of.tolist(),
            "replay": {},
        },
        "replay_status": [],
        "fates": list(SAMPLE_FATES),
        "fate_counts": {
            k: v
            for k, v in (("trained", trained), ("not_trained", sample.response_length - trained))
            if v
        },  # fmt: skip
        "ledger_counts": None,
        "consistent": None,
        "message": sample.metadata,
        "echoes": [],
        "fallback": None,
    }
