"""A service's startup error --> one line on stderr and exit status 2, never a traceback.

The errors caught here are the operator's to fix, not bugs: a port another process holds
(`PortInUse`: a second `apprentice serve inference` on the same host must not start and take half of
the traffic), a public bind without keys (`InsecureBind`), keys that do not parse (`KeyConfigError`),
TLS files that cannot be used (`TLSConfigError`), a model that cannot be loaded here
(`ModelUnavailable`: an unknown name, a missing package), a variable that was renamed (`SettingMoved`). Their messages already say what to change; a
traceback would only bury that line. Anything else still raises (a bug keeps its traceback).

Every service's `main` (both `apprentice serve NAME` and `python -m services.NAME` call it) is wrapped:

    @exit_on_startup_error("inference")
    def main(argv: list[str] | None = None) -> int: ...
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., int])

EXIT_STARTUP_ERROR = 2
"""Exit status of a service that could not start because of its settings or its environment (as
argparse's usage errors): supervisors and tests tell it from a crash (1) or a signal."""


def startup_errors() -> tuple[type[Exception], ...]:
    """The exception types that mean "fix the settings or the host", imported only when needed so an
    entry point's `--help` stays light."""
    # deferred: shared.models and the security modules load numpy, grpc and cryptography; every service's
    # __main__ (all imported by `apprentice`) imports this module
    from shared.models import ModelUnavailable
    from shared.rpc.grpc_util import PortInUse
    from shared.security.binding import InsecureBind
    from shared.security.keys import KeyConfigError
    from shared.security.tls import TLSConfigError
    from shared.settings import SettingMoved

    return PortInUse, InsecureBind, KeyConfigError, TLSConfigError, ModelUnavailable, SettingMoved


def one_line(service: str, exc: BaseException) -> str:
    """`apprentice <service>: <message>` on a single line (a multi-line message is joined)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"apprentice {service}: {text}"


def exit_on_startup_error(service: str) -> Callable[[F], F]:
    """Wrap a service's `main`: a startup error prints one line and returns EXIT_STARTUP_ERROR."""
    def wrap(main: F) -> F:
        @functools.wraps(main)
        def run(*args: object, **kwargs: object) -> int:
            try:
                return main(*args, **kwargs)
            except startup_errors() as e:
                print(one_line(service, e), file=sys.stderr, flush=True)
                return EXIT_STARTUP_ERROR
        return run  # type: ignore[return-value]
    return wrap
