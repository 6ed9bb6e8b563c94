"""`apprentice serve weights`: parse settings, configure logging, serve until SIGTERM/SIGINT (graceful)."""

from __future__ import annotations

import argparse

from services.weights.settings import WeightsSettings
from shared.kafka.durability import check_at_start
from shared.logs import configure_logging
from shared.rpc.grpc_util import service_host
from shared.service import run_service
from shared.startup import exit_on_startup_error


@exit_on_startup_error("weights")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="apprentice serve weights", description=__doc__)
    ap.add_argument("--port", type=int, help="gRPC port (default: APPRENTICE_WEIGHTS_PORT or 50052)")
    ap.add_argument("--policy", choices=("manual", "auto", "canary"), help="override APPRENTICE_WEIGHTS_POLICY")
    ns = ap.parse_args(argv)

    settings = WeightsSettings(**{k: v for k, v in (("port", ns.port), ("policy", ns.policy)) if v is not None})
    check_at_start(settings.common)
    configure_logging("weights", settings.common.log_level, settings.common.log_json)
    if settings.common.torch_threads:
        # heavy: torch, only to set its threads; `apprentice` imports this module
        import torch

        torch.set_num_threads(settings.common.torch_threads)
    # deferred: the server (registry, gRPC stack) loads only to run; `apprentice` imports this module
    from services.weights.service import RunningServer

    return run_service(RunningServer(settings), metrics_port=settings.metrics_port,
                       metrics_host=service_host(settings.host, settings.common))


if __name__ == "__main__":
    raise SystemExit(main())
