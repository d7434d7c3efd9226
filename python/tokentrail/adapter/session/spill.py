"""Image bytes of kept finishes, out of the heap: a finished session's samples are kept for the
retention window (a repeated finish answers them again), and the base64 of their images is by
far the most of them. While kept, each image's text lives once, by digest, in a temporary file;
a repeated finish reads it back. The file is emptied once no kept finish names any image.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
from typing import IO, Any

from tokentrail.trajectory.linearize import Trajectory
from tokentrail.trajectory.sample import Sample

__all__ = ["SpilledImages"]

_KEY = "data"


class SpilledImages:
    """Image texts by digest in a temporary file, counted by the kept finishes that name them."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self._where: dict[str, tuple[int, int]] = {}
        self._users: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._where)

    def spill(self, trajectory: Trajectory) -> Trajectory:
        """A copy of `trajectory` whose samples' images name their digest without their text,
        which is written here (`trajectory` itself is left as it is)."""
        if not any(_images(s) for s in trajectory.samples):
            return trajectory
        with self._lock:
            samples = [self._spill_sample(s) for s in trajectory.samples]
        return dataclasses.replace(trajectory, samples=samples)

    def _spill_sample(self, sample: Sample) -> Sample:
        images = _images(sample)
        if not images:
            return sample
        kept = []
        for image in images:
            digest, text = image.get("digest"), image.get(_KEY)
            if not isinstance(digest, str) or not isinstance(text, str):
                kept.append(image)
                continue
            if digest not in self._where:
                if self._file is None:
                    self._file = tempfile.TemporaryFile(prefix="tokentrail-images-")
                self._file.seek(0, 2)
                offset = self._file.tell()
                data = text.encode("ascii")
                self._file.write(data)
                self._where[digest] = (offset, len(data))
            self._users[digest] = self._users.get(digest, 0) + 1
            kept.append({k: v for k, v in image.items() if k != _KEY})
        return dataclasses.replace(sample, metadata={**sample.metadata, "images": kept})

    def restore(self, trajectory: Trajectory) -> Trajectory:
        """A copy of a spilled `trajectory` with its images' texts back."""
        if not any(_images(s) for s in trajectory.samples):
            return trajectory
        with self._lock:
            samples = [self._restore_sample(s) for s in trajectory.samples]
        return dataclasses.replace(trajectory, samples=samples)

    def _restore_sample(self, sample: Sample) -> Sample:
        images = _images(sample)
        if not images:
            return sample
        out = []
        for image in images:
            where = self._where.get(image.get("digest", "")) if _KEY not in image else None
            if where is None or self._file is None:
                out.append(image)
                continue
            self._file.seek(where[0])
            out.append({**image, _KEY: self._file.read(where[1]).decode("ascii")})
        return dataclasses.replace(sample, metadata={**sample.metadata, "images": out})

    def release(self, trajectory: Trajectory) -> None:
        """A spilled `trajectory` is no longer kept: its images' texts go once nothing names
        them, and the file is emptied once nothing is named."""
        with self._lock:
            for sample in trajectory.samples:
                for image in _images(sample):
                    digest = image.get("digest")
                    if _KEY in image or digest not in self._users:
                        continue
                    self._users[digest] -= 1
                    if not self._users[digest]:
                        del self._users[digest], self._where[digest]
            if not self._where and self._file is not None:
                self._file.close()
                self._file = None


def _images(sample: Sample) -> list[dict[str, Any]]:
    """The sample's image tags, or none when any is not a mapping (left as it is)."""
    images = sample.metadata.get("images")
    if not isinstance(images, list) or not all(isinstance(i, dict) for i in images):
        return []
    return images
