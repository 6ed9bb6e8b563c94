"""A service's startup error --> one line on stderr and exit status 2, never a traceback.

The errors caught here are the operator's to fix, not bugs: a port another process holds
(`PortInUse`: a second `apprentice serve inference` on the same host must not start and take half of
the traffic), a public bind without keys (`InsecureBind`), keys that do not parse (`KeyConfigError`),
TLS files that cannot be used (`TLSConfigError`), a model that cannot be loaded here
(`ModelUnavailable`: an unknown name, a missing package), a variable that was renamed (`SettingMoved`), a
Kafka producer or topic that could lose acknowledged records when a broker goes (`UnsafeKafkaConfig`), a
request the Kafka broker refuses this principal (`KafkaAccessDenied`, or a Kafka client's own authorization
error raised anywhere during the start: shared/kafka/authorization.py words both the same way), a
value the settings refuse (pydantic's `ValidationError` raised by a settings class: a typo inside a group, a
field of another kind, a number out of range). Their messages already say what to change; a traceback would
only bury that line. Anything else still raises (a bug keeps its traceback, a `ValidationError` of anything
but a settings class included).

Every service's `main` (both `apprentice serve NAME` and `python -m services.NAME` call it) is wrapped:

    @exit_on_startup_error("inference")
    def main(argv: list[str] | None = None) -> int: ...
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

from pydantic import ValidationError

F = TypeVar("F", bound=Callable[..., int])

EXIT_STARTUP_ERROR = 2
"""Exit status of a service that could not start because of its settings or its environment (as
argparse's usage errors): supervisors and tests tell it from a crash (1) or a signal."""


def startup_errors() -> tuple[type[Exception], ...]:
    """The exception types that mean "fix the settings or the host", imported only when needed so an
    entry point's `--help` stays light."""
    # deferred: shared.models and the security modules load numpy, grpc and cryptography; every service's
    # __main__ (all imported by `apprentice`) imports this module
    from shared.kafka.authorization import KafkaAccessDenied
    from shared.kafka.durability import UnsafeKafkaConfig
    from shared.kafka.signing import SigningKeyMissing
    from shared.models import ModelUnavailable
    from shared.rpc.grpc_util import PortInUse
    from shared.security.binding import InsecureBind
    from shared.security.keys import KeyConfigError
    from shared.security.tls import TLSConfigError
    from shared.settings import SettingMoved

    return (PortInUse, InsecureBind, KeyConfigError, TLSConfigError, ModelUnavailable, SettingMoved,
            SigningKeyMissing, UnsafeKafkaConfig, KafkaAccessDenied)


def kafka_refusal(exc: BaseException) -> BaseException | None:
    """The Kafka authorization refusal `exc` is or was raised from (a client's own error, confluent-kafka's or
    aiokafka's, as `KafkaAccessDenied`), else None."""
    # deferred: confluent_kafka, only once something failed
    from shared.kafka.authorization import KafkaAccessDenied, denied

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        refusal = cur if isinstance(cur, KafkaAccessDenied) else denied(cur)
        if refusal is not None:
            return refusal
        cur = cur.__cause__ or cur.__context__
    return None


def one_line(service: str, exc: BaseException) -> str:
    """`apprentice <service>: <message>` on a single line (a multi-line message is joined)."""
    text = invalid_settings(exc) if isinstance(exc, ValidationError) else None
    text = text or " ".join(str(exc).split()) or type(exc).__name__
    return f"apprentice {service}: {text}"


def is_settings_error(exc: ValidationError) -> bool:
    """Raised while reading a settings class (`<Name>Settings`, shared/settings.py), not by a model of data."""
    return exc.title.endswith("Settings")


def invalid_settings(exc: ValidationError) -> str:
    """Each refused setting as `path: reason` (pydantic's own text names the input type and a URL; the
    input itself is never echoed: it may be a secret)."""
    problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(settings)'}: {err['msg']}"
                         for err in exc.errors(include_url=False, include_input=False))
    return f"invalid settings ({exc.title}): {problems} (docs/settings.md lists every variable)"


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
            except ValidationError as e:
                if not is_settings_error(e):
                    raise
                print(one_line(service, e), file=sys.stderr, flush=True)
                return EXIT_STARTUP_ERROR
            except Exception as e:
                refusal = kafka_refusal(e)
                if refusal is None:
                    raise
                print(one_line(service, refusal), file=sys.stderr, flush=True)
                return EXIT_STARTUP_ERROR
        return run  # type: ignore[return-value]
    return wrap
