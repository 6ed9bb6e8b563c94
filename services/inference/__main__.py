"""`apprentice serve inference`: parse settings, load the model, serve until SIGTERM/SIGINT (graceful)."""

from __future__ import annotations

import argparse
import sys

from services.inference.settings import InferenceSettings
from shared.kafka.durability import check_at_start
from shared.logs import configure_logging
from shared.rpc.grpc_util import service_host
from shared.service import run_service
from shared.startup import exit_on_startup_error


@exit_on_startup_error("inference")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apprentice serve inference", description=__doc__)
    ap.add_argument("--port", type=int, help="gRPC port (default: APPRENTICE_INFERENCE_PORT or 50051)")
    ap.add_argument("--engine", choices=("transformers", "vllm"), help="override APPRENTICE_INFERENCE_ENGINE__KIND")
    ns = ap.parse_args(argv)

    overrides = {k: v for k, v in (("port", ns.port), ("engine", ns.engine)) if v is not None}
    settings = InferenceSettings(**overrides)
    check_at_start(settings.common)         # topics that would lose records when a broker goes: exit 2
    configure_logging("inference", settings.common.log_level, settings.common.log_json)
    # heavy: torch (the engine); `apprentice` imports this module, so --help stays fast
    from services.inference.service import InferenceApp

    metrics_host = service_host(settings.host, settings.common, extra_keys=settings.legacy_key_entries())
    return run_service(InferenceApp(settings), metrics_port=settings.metrics_port, metrics_host=metrics_host)


if __name__ == "__main__":
    sys.exit(main())
