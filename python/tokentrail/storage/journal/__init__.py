"""The journal: every recorded turn kept durably in SQLite (`writer`), read back (`read`),
recovered (`open`, `rebuild`, `receipts`), compacted (`compact`) and migrated (`migrate`, `v1`)."""

from tokentrail.storage.journal.writer import Journal

__all__ = ["Journal"]
