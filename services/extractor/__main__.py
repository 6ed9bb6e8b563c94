"""`apprentice serve extractor`: parse settings, configure logging, run until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse

from services.extractor.settings import ExtractorSettings
from shared.kafka.durability import check_at_start
from shared.logs import configure_logging
from shared.rpc.grpc_util import service_host
from shared.service import run_service
from shared.startup import exit_on_startup_error


@exit_on_startup_error("extractor")
def main(argv: list[str] | None = None) -> int:
    # parsed before anything starts: `--help` prints and exits without side effects
    argparse.ArgumentParser(prog="apprentice serve extractor", description=__doc__,
                            epilog="Settings: APPRENTICE_EXTRACTOR_* and APPRENTICE_* variables.").parse_args(argv)

    settings = ExtractorSettings()
    check_at_start(settings.common)

    configure_logging("extractor", settings.common.log_level, settings.common.log_json)
    metrics_host = service_host(settings.host, settings.common)
    # heavy: the service loads presidio/spaCy; `apprentice` imports this module, so --help stays fast
    from services.extractor.service import ExtractorApp

    return run_service(ExtractorApp(settings), metrics_port=settings.metrics_port, metrics_host=metrics_host)


if __name__ == "__main__":
    raise SystemExit(main())
