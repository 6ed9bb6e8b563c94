"""Checkpoint --> a version in the Weights store (`Weights.Upload`, chunked, sha256-checked) and its
announcement on `apprentice.checkpoints.v1` (`CheckpointPublished`).

Idempotent across crashes: the upload carries `training_metadata["checkpoint_id"]`; before uploading,
the store is asked (`Weights.List`) whether a version with that id exists, so a restart between upload
and bookkeeping re-announces the same version instead of creating a second one. The announcement's
event id is deterministic in (model, tenant, checkpoint id), so consumers drop a repeat.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from services.trainer.checkpoint import Checkpoint
from shared.contracts.events import deterministic_id, make_envelope
from shared.kafka.producer import EventProducer
from shared.proto.apprentice.v1 import common_pb2, events_pb2, weights_pb2
from shared.weights.client import KNOWLEDGE_VERSIONS, LORA, TRAINED_INTERACTIONS, upload_version

log = logging.getLogger(__name__)

SOURCE = "trainer"


def manifest_digest(manifest: weights_pb2.Manifest) -> str:
    """sha256 over the manifest's "path sha256" lines (sorted): one hash naming the exact bytes."""
    lines = sorted(f"{f.path} {f.sha256}" for f in manifest.files)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def provenance_metadata(ckpt: Checkpoint) -> dict[str, str]:
    """Where the version's provenance is: the counts of interactions it learned from and of knowledge items it
    consolidated, and the version files that list them (`TRAINED_INTERACTIONS`, `KNOWLEDGE_VERSIONS`, their
    sha256 in the manifest's file list). The lists stay out of the manifest, which every `Weights.List` returns
    for every version, under a 64 KiB metadata bound a large knowledge base would pass."""
    out: dict[str, str] = {}
    for name, key in ((TRAINED_INTERACTIONS, "trained_interactions"), (KNOWLEDGE_VERSIONS, "knowledge_versions")):
        path = ckpt.weights_dir / name
        if path.exists():      # (a checkpoint written before the file existed has none)
            out |= {f"{key}_count": str(len(json.loads(path.read_text(encoding="utf-8")))), f"{key}_file": name}
    return out


def data_offsets(ckpt: Checkpoint, group: str) -> list[common_pb2.TopicOffsets]:
    return [common_pb2.TopicOffsets(topic=d["topic"], partition=int(d["partition"]), start_offset=int(d["start"]),
                                    end_offset=int(d["end"]), group=group) for d in ckpt.state.get("data_offsets", [])]


class Publisher:
    def __init__(self, stub: Any, producer: EventProducer, checkpoints_topic: str, *, model: str, tenant: str,
                 group: str, timeout: float = 600.0) -> None:
        self.stub = stub
        self.producer = producer
        self.topic = checkpoints_topic
        self.model = model
        self.tenant = tenant
        self.group = group
        self.timeout = timeout

    def _existing(self, ckpt_id: str) -> weights_pb2.Manifest | None:
        resp = self.stub.List(weights_pb2.ListVersionsRequest(model=self.model), timeout=30)
        for m in resp.versions:
            if m.training_metadata.get("checkpoint_id") == ckpt_id:
                return m
        return None

    def publish(self, ckpt: Checkpoint, parent_version: str) -> weights_pb2.Manifest:
        """Upload (unless already stored) and announce. Raises grpc.RpcError / DeliveryError when the
        store or the broker is unavailable; the caller retries later (the checkpoint stays on disk)."""
        st = ckpt.state
        metrics = {k: float(v) for k, v in st.get("metrics", {}).items()}
        offsets = data_offsets(ckpt, self.group)
        manifest = self._existing(ckpt.id)
        if manifest is None:
            header = weights_pb2.UploadHeader(
                model=self.model, parent_version=parent_version, kind=st["kind"], base_model=self.model,
                training_metadata={
                    "checkpoint_id": ckpt.id, "trainer_seq": str(st["seq"]), "optimizer_steps": str(st.get("steps", 0)),
                    "trainer_settings": json.dumps(st.get("settings", {}), sort_keys=True),
                    **provenance_metadata(ckpt),
                },
                data_offsets=offsets, algorithm=st.get("algorithm", ""), train_metrics=metrics, tenant=self.tenant,
                base_version="base" if st["kind"] == LORA else "",
            )
            manifest = upload_version(self.stub, header, ckpt.weights_dir, timeout=self.timeout)
            log.info("uploaded version", extra={"version": manifest.version, "checkpoint": ckpt.id})
        announce(self.producer, self.topic, manifest, tenant=self.tenant, checkpoint_id=ckpt.id)
        return manifest


def announce(producer: EventProducer, topic: str, manifest: weights_pb2.Manifest, *, tenant: str,
             checkpoint_id: str) -> None:
    """`CheckpointPublished` for a stored version: what makes the weights service's policy gate it. The
    event id is deterministic in (model, tenant, checkpoint id), so a repeat is dropped by consumers."""
    event = events_pb2.CheckpointPublished(
        envelope=make_envelope(tenant, source=SOURCE,
                               event_id=deterministic_id("checkpoint", manifest.model, tenant, checkpoint_id)),
        model=manifest.model, version=manifest.version, parent_version=manifest.parent_version, kind=manifest.kind,
        base_model=manifest.base_model, algorithm=manifest.algorithm, data_offsets=manifest.data_offsets,
        metrics=manifest.train_metrics, manifest_sha256=manifest_digest(manifest), tenant=tenant,
    )
    producer.produce(topic, manifest.model, event)
    producer.flush()
