"""The real inference service for tests and benchmarks: port 0, the tiny model, an isolated spool.

Topics are read with `tests/helpers/kafka.py`; a Weights service to download versions from is
`tests/helpers/weights.py`.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any


def start_inference(tmp: Path, *, model: str = "tiny-random", bootstrap: str = "127.0.0.1:9092",
                    topic_prefix: str = "", weights_endpoint: str = "127.0.0.1:1", **overrides: Any) -> Any:
    """A started InferenceApp (tiny model, port 0, metrics and HTTP API off unless `http_port` is given,
    spool/versions under `tmp`)."""
    from services.inference.service import serve
    from services.inference.settings import InferenceSettings

    s: dict[str, Any] = dict(port=0, metrics_port=0, http_port=0, host="127.0.0.1",
             pod_id=f"test-{uuid.uuid4().hex[:6]}", spool_dir=tmp / "spool", download_dir=tmp / "versions",
             weights_endpoint=weights_endpoint, heartbeat_interval_s=0.5, startup_catchup_s=5.0, grace_s=5.0,
             common={"model": model, "kafka_bootstrap": bootstrap, "topic_prefix": topic_prefix,
                     "home": tmp})
    s.update(overrides)
    return serve(InferenceSettings(**s))


def spool_bytes(app: Any) -> bytes:
    """Everything an inference app's capture spool holds on disk, in segment order."""
    return b"".join(p.read_bytes() for p in sorted(Path(app.settings.spool_path).glob("*.seg")))
