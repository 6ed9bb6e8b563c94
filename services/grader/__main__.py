"""`apprentice serve grader` / `python -m services.grader`: validate the config, then run the faust
runtime (services/grader/service.py)."""

from __future__ import annotations

import argparse
import sys

from services.grader.settings import GraderSettings
from shared.grading import GraderConfigError, load_grader_config
from shared.kafka.durability import check_at_start
from shared.logs import configure_logging
from shared.startup import exit_on_startup_error


@exit_on_startup_error("grader")
def main(argv: list[str] | None = None) -> int:
    # parsed before anything starts: `--help` prints and exits without side effects
    argparse.ArgumentParser(prog="apprentice serve grader", description=__doc__,
                            epilog="Settings: APPRENTICE_GRADER_* and APPRENTICE_* variables.").parse_args(argv)
    settings = GraderSettings()
    check_at_start(settings.common, replication=settings.replication)   # its changelogs too
    configure_logging("grader", settings.log_level or settings.common.log_level, settings.common.log_json)
    try:
        config = load_grader_config(settings.config_path)
    except GraderConfigError as e:
        print(f"apprentice grader: {e}\n(set APPRENTICE_GRADER_CONFIG_PATH to a valid file)", file=sys.stderr)
        return 2
    # heavy (faust): imported only after the config is known to be good
    from services.grader.service import GraderService
    from shared.rpc.grpc_util import service_host
    from shared.service import run_service

    metrics_host = service_host("", settings.common)
    return run_service(GraderService(settings, config), metrics_port=settings.metrics_port, metrics_host=metrics_host)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
