"""The process-wide PII detector: built on first use, by name.

Apart from detector.py (the interface every implementation imports) so that choosing an implementation
does not make the interface import its implementations: no import cycle.
"""

from __future__ import annotations

import threading

from shared.privacy.detector import PiiDetector
from shared.privacy.presidio_detector import PresidioDetector


def create_detector(name: str = "presidio") -> PiiDetector:
    """The detector called `name`; raises on an unknown name (heavy imports happen here, not at import)."""
    if name == "presidio":
        return PresidioDetector()
    raise ValueError(f"unknown PII detector {name!r}; known: presidio")


_lock = threading.Lock()
_instance: PiiDetector | None = None


def get_detector() -> PiiDetector:
    """The process-wide detector, built on first use (double-checked under a lock: one build even when
    many request threads arrive at once)."""
    global _instance
    if _instance is None:
        with _lock:
            if _instance is None:
                _instance = create_detector()
    return _instance
