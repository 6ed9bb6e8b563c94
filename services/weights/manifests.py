"""Manifests and per-model promotion state <--> JSON files, written atomically (tmp + fsync + rename).

Layout under the store root:
    models/<quoted model>/versions/<version>.json   one `Manifest` per version (protobuf JSON)
    models/<quoted model>/state.json                `ModelState`: what each tenant slot serves
A version exists exactly when its manifest file exists; the manifest is written last, after every blob
it names is committed, so a partial upload is never visible.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

from google.protobuf import json_format

from shared.contracts.orders import Slot, promoted_for
from shared.proto.apprentice.v1 import weights_pb2

VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NUMBERED_RE = re.compile(r"^v(\d+)$")


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class ModelState:
    """Promotion state of one model; changed only together with a published order."""

    model: str
    next_number: int = 1
    """The next `vN` the store assigns; never reused, even after GC."""
    slots: dict[str, Slot] = field(default_factory=dict)
    last_order_id: str = ""
    last_order_at: float = 0.0
    last_order_slot: str = ""
    handled_events: list[str] = field(default_factory=list)
    """CheckpointPublished event ids whose effect is complete (idempotent redelivery); newest last, bounded."""

    def slot(self, tenant: str) -> Slot:
        return self.slots.setdefault(tenant, Slot())

    def serving_for(self, tenant: str) -> str:
        """The version `tenant`'s requests get: its own slot's, else the operator slot's, else base."""
        return promoted_for(self.slots, tenant)

    def note_handled(self, event_id: str, keep: int = 1000) -> None:
        if event_id not in self.handled_events:
            self.handled_events.append(event_id)
            del self.handled_events[:-keep]

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ModelState:
        raw = json.loads(data)
        slots = {k: Slot(**{**v, "history": tuple(v.get("history", ()))}) for k, v in raw.pop("slots", {}).items()}
        return cls(slots=slots, **raw)


class ManifestStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root) / "models"
        self.root.mkdir(parents=True, exist_ok=True)

    def _model_dir(self, model: str) -> Path:
        return self.root / quote(model, safe="")

    def _path(self, model: str, version: str) -> Path:
        if not VERSION_RE.match(version):
            raise ValueError(f"invalid version name {version!r}")
        return self._model_dir(model) / "versions" / f"{version}.json"

    def models(self) -> list[str]:
        return sorted(unquote(p.name) for p in self.root.iterdir() if p.is_dir())

    def exists(self, model: str, version: str) -> bool:
        return VERSION_RE.match(version) is not None and self._path(model, version).is_file()

    def load(self, model: str, version: str) -> weights_pb2.Manifest | None:
        try:
            data = self._path(model, version).read_bytes()
        except (FileNotFoundError, ValueError):
            return None
        return json_format.Parse(data, weights_pb2.Manifest())

    def save(self, manifest: weights_pb2.Manifest) -> None:
        text = json_format.MessageToJson(manifest, preserving_proto_field_name=True, indent=1)
        atomic_write(self._path(manifest.model, manifest.version), text.encode())

    def delete(self, model: str, version: str) -> bool:
        try:
            self._path(model, version).unlink()
            return True
        except FileNotFoundError:
            return False

    def list(self, model: str) -> list[weights_pb2.Manifest]:
        """Every stored version of `model`, oldest first."""
        vdir = self._model_dir(model) / "versions"
        if not vdir.is_dir():
            return []
        out = []
        for p in vdir.glob("*.json"):
            m = self.load(model, p.stem)
            if m is not None:
                out.append(m)
        return sorted(out, key=version_order_key)

    def load_state(self, model: str) -> ModelState:
        try:
            return ModelState.from_json((self._model_dir(model) / "state.json").read_bytes())
        except FileNotFoundError:
            return ModelState(model=model)

    def save_state(self, state: ModelState) -> None:
        atomic_write(self._model_dir(state.model) / "state.json", state.to_json())


def version_order_key(m: weights_pb2.Manifest) -> tuple[float, int, str]:
    """Creation order: created_at, then the number of `vN`, then the name."""
    match = NUMBERED_RE.match(m.version)
    return (m.created_at.seconds + m.created_at.nanos / 1e9, int(match.group(1)) if match else -1, m.version)


def now() -> float:
    return time.time()
