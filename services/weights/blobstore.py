"""Bytes --> content-addressed blobs (sha256). The boundary an object store can implement later.

A blob is visible under its hash only once all of its bytes are written and verified: writers stream into
a private temporary object and `commit` makes it visible atomically (rename on a file system, a
conditional put on an object store). Readers therefore never see a partial blob.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class BlobMismatch(ValueError):
    """The bytes written do not have the declared size or sha256. Fatal for that upload; nothing is kept."""


class BlobWriter(ABC):
    """One blob being written: bytes in order, hashed on the fly, invisible until `commit`."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Bytes written so far."""

    @property
    @abstractmethod
    def sha256(self) -> str:
        """Hex sha256 of the bytes written so far."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Append `data`."""

    @abstractmethod
    def commit(self, expected_sha256: str, expected_size: int) -> str:
        """Verify size and hash, then make the blob visible under its hash (idempotent if it already
        exists); raise BlobMismatch (and discard the bytes) when they differ."""

    @abstractmethod
    def abort(self) -> None:
        """Discard everything written; safe to call twice or after commit."""


class BlobStore(ABC):
    """Content-addressed storage. Keys are lowercase hex sha256 digests."""

    @abstractmethod
    def writer(self) -> BlobWriter:
        """A fresh writer for one blob."""

    @abstractmethod
    def exists(self, sha256: str) -> bool:
        """Whether a committed blob with this hash exists."""

    @abstractmethod
    def size(self, sha256: str) -> int:
        """Size in bytes of a committed blob; FileNotFoundError if absent."""

    @abstractmethod
    def open(self, sha256: str) -> BinaryIO:
        """A readable, seekable binary stream over a committed blob; FileNotFoundError if absent."""

    @abstractmethod
    def delete(self, sha256: str) -> bool:
        """Remove a blob; False when it was not there."""

    @abstractmethod
    def list(self) -> Iterator[str]:
        """Every committed blob's hash."""

    @abstractmethod
    def local_path(self, sha256: str) -> Path | None:
        """A file path holding the blob when the backend is a local file system (lets callers hard-link
        instead of copying); None for remote backends."""

    @abstractmethod
    def clean_temporary(self, older_than_s: float) -> int:
        """Remove abandoned partial writes older than `older_than_s` seconds; return how many."""
