"""The real PII detector, counting what it reads: tests that a text goes through it once per request."""

from __future__ import annotations

from collections import Counter

from shared.privacy import Span
from shared.privacy.presidio_detector import PresidioDetector


class CountingDetector(PresidioDetector):
    """The real detector, counting the texts it is asked to read."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def find(self, text: str, *, names: bool = True) -> list[Span]:
        self.calls[text] += 1
        return super().find(text, names=names)
