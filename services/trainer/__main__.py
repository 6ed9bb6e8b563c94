"""`apprentice serve trainer`: settings --> the training loop until SIGTERM/SIGINT (torchrun: rank 0 reads
Kafka, checkpoints and publishes; the other ranks train what it broadcasts)."""

from __future__ import annotations

import argparse
import sys

from services.trainer.settings import TrainerSettings
from services.trainer.steplog import ReportingUnavailable, require_available
from shared.kafka.durability import check_at_start
from shared.logs import configure_logging
from shared.rpc.grpc_util import service_host
from shared.service import run_service
from shared.startup import EXIT_STARTUP_ERROR, exit_on_startup_error, one_line


@exit_on_startup_error("trainer")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="apprentice serve trainer", description="GRPO + OEL trainer (one tenant)")
    parser.add_argument("--tenant", help="overrides APPRENTICE_TRAINER_TENANT")
    args = parser.parse_args(argv)

    settings = TrainerSettings(**({"tenant": args.tenant} if args.tenant else {}))
    check_at_start(settings.common)

    try:
        require_available(settings.experiment_log.kind)   # an operator's setting without its package
    except ReportingUnavailable as e:
        print(one_line("trainer", e), file=sys.stderr, flush=True)
        return EXIT_STARTUP_ERROR
    # heavy: torch; `apprentice` imports this module, so --help stays fast
    from services.trainer import distributed
    from services.trainer.loop import follower
    from services.trainer.service import TrainerApp

    configure_logging("trainer", settings.common.log_level, settings.common.log_json)
    if distributed.init_from_env() and distributed.rank() > 0:
        return follower(settings)     # no metrics, no signals of its own: rank 0 tells it when to stop
    return run_service(TrainerApp(settings), metrics_port=settings.metrics_port,
                       metrics_host=service_host("", settings.common))


if __name__ == "__main__":
    sys.exit(main())
