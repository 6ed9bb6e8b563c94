"""Blob store kind (settings `store.kind`) --> a BlobStore: the one place that knows every backend.

Apart from blobstore.py (the interface the backends import) so that the interface never imports them.
"""

from __future__ import annotations

from pathlib import Path

from services.weights.blobstore import BlobStore
from services.weights.local_blobstore import LocalBlobStore

BACKENDS = {"local": LocalBlobStore}
"""Name --> class taking the root directory. An object-store backend joins here."""


def make_blob_store(kind: str, root: Path) -> BlobStore:
    """The blob store called `kind`; unknown names raise with the list of known ones."""
    try:
        cls = BACKENDS[kind]
    except KeyError:
        raise ValueError(f"unknown blob store {kind!r}; known: {', '.join(sorted(BACKENDS))}") from None
    return cls(root)
