"""A durable set of processed event ids: makes at-least-once delivery an exactly-once *effect*.

Consumers commit offsets after their effect, so a crash in between redelivers records; an effect that
records the event id in the same SQLite transaction as its own writes is applied once.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path


class ProcessedEvents:
    def __init__(self, path: Path | str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS processed (event_id TEXT PRIMARY KEY, at REAL NOT NULL)")

    def seen(self, event_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM processed WHERE event_id = ?", (event_id,)).fetchone() is not None

    def mark(self, event_id: str) -> bool:
        """Record `event_id`; False if it was already there (the effect must not be applied again)."""
        cur = self.db.execute("INSERT OR IGNORE INTO processed (event_id, at) VALUES (?, ?)", (event_id, time.time()))
        return cur.rowcount == 1

    def apply_once(self, event_id: str, effect: Callable[[sqlite3.Connection], None]) -> bool:
        """Run `effect` (writes on this same database) and record `event_id` in one transaction, unless the
        id is already recorded. Returns whether the effect ran."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            if self.seen(event_id):
                self.db.execute("ROLLBACK")
                return False
            effect(self.db)
            self.db.execute("INSERT INTO processed (event_id, at) VALUES (?, ?)", (event_id, time.time()))
            self.db.execute("COMMIT")
            return True
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def prune(self, older_than_s: float) -> int:
        """Forget ids older than the topic's retention: they can no longer be redelivered."""
        cur = self.db.execute("DELETE FROM processed WHERE at < ?", (time.time() - older_than_s,))
        return cur.rowcount

    def close(self) -> None:
        self.db.close()
