"""`apprentice serve extractor`: parse settings, configure logging and metrics, run until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal

from shared.startup import exit_on_startup_error


@exit_on_startup_error("extractor")
def main(argv: list[str] | None = None) -> int:
    # parsed before anything starts: `--help` prints and exits without side effects
    argparse.ArgumentParser(prog="apprentice serve extractor", description=__doc__,
                            epilog="Settings: APPRENTICE_EXTRACTOR_* and APPRENTICE_* variables.").parse_args(argv)
    from services.extractor.config import ExtractorSettings

    settings = ExtractorSettings()
    from shared.grpc_util import service_host
    from shared.logs import configure_logging
    from shared.metrics import start_metrics_server

    configure_logging("extractor", settings.common.log_level, settings.common.log_json)
    start_metrics_server(settings.metrics_port, service_host(settings.grpc_host, settings.common))
    from services.extractor.app import ExtractorApp

    app = ExtractorApp(settings)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: app.request_stop())
    app.start()
    app.wait()
    app.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
