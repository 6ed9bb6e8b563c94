"""`apprentice` command line: one entry point, each sub-command a function imported here.

Commands (docs/architecture.md §9): kafka, topics, tail, serve, up, down, status, demo, weights, knowledge,
grader, secrets, env, dashboard. Service-specific commands live with their service (`services/<name>/cli.py`),
the local stack's and the demo's with their tool (tools/stack/, tools/demo/); `serve NAME` runs the
service's `__main__`. Every one is a plain import below, so an import checker sees what the CLI runs.
The services' entry modules import their heavy dependencies (torch, transformers, faust) only when they
run, so `apprentice --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from services.dashboard import __main__ as dashboard_main
from services.extractor import __main__ as extractor_main
from services.extractor import cli as knowledge_cli
from services.grader import __main__ as grader_main
from services.grader import cli as grader_cli
from services.inference import __main__ as inference_main
from services.trainer import __main__ as trainer_main
from services.weights import __main__ as weights_main
from services.weights import cli as weights_cli
from shared.contracts.stack_endpoints import apply_stack_endpoints
from shared.contracts.topic_access import ADMIN, OPERATOR
from shared.settings import default_home
from shared.startup import EXIT_STARTUP_ERROR, kafka_refusal
from tools import devca, record_keys
from tools.broker import cli as kafka_cmds
from tools.broker.local_broker import apply_client_env
from tools.cli import failures
from tools.demo import cli as demo_cli
from tools.stack import cli as stack_cli
from tools.stack import client_env

Run = Callable[[list[str]], "int | None"]
"""A command's function: the arguments after the command's name in, the exit status out (None = 0)."""


@dataclass(frozen=True)
class Command:
    run: Run
    help: str


SERVE: dict[str, Run] = {"inference": inference_main.main, "grader": grader_main.main,
                         "extractor": extractor_main.main, "trainer": trainer_main.main,
                         "weights": weights_main.main, "dashboard": dashboard_main.main}
"""`apprentice serve NAME`: each service's `__main__`."""
SERVICES = tuple(SERVE)

DELEGATED: dict[str, Command] = {
    "weights": Command(weights_cli.main, "list / promote / rollback / status of model versions"),
    "knowledge": Command(knowledge_cli.main, "show and curate the experiential knowledge bases"),
    "demo": Command(demo_cli.main, "run the closed learning loop with simulated users"),
    "up": Command(stack_cli.up, "start the broker and the five services as supervised processes"),
    "down": Command(stack_cli.down, "stop the local stack"),
    "status": Command(stack_cli.status, "health, versions, lag, spool depth of the local stack"),
    "secrets": Command(devca.main, "create a stack's development CA, keys and tokens"),
    "keys": Command(record_keys.main, "record-signing keys: keys records init | rotate PRINCIPAL | list | retire"),
    "env": Command(client_env.main,
                   "print the shell lines that make stock clients trust the local stack: eval \"$(apprentice env)\""),
    "dashboard": Command(dashboard_main.main, "the operator dashboard: what the model is learning (web)"),
    "grader": Command(grader_cli.main, "set, list or delete a tenant's grading rules while the grader runs"),
}
"""Commands whose argument parsing is their own: the function gets every argument after the command."""

BROKER_COMMANDS: dict[str, Command] = {
    "kafka": Command(kafka_cmds.kafka, "local single-node KRaft broker: start | stop | status | fetch"),
    "topics": Command(kafka_cmds.topics, "create (if missing) and list the Apprentice topics"),
    "tail": Command(kafka_cmds.tail, "print a topic's records as JSON lines"),
}


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), or "unknown" when run from a bare tree."""

    try:
        return version("apprentice")
    except PackageNotFoundError:
        return "unknown"


SERVER_COMMANDS = ("serve", "demo", "dashboard")
"""Commands that run servers or a whole stack: an error there is a bug or a crash to see in full, never worded
as "the stack is down"."""


def main(argv: list[str] | None = None) -> int:
    """Run one command. Three failures every command shares end here in one way (tools/cli/failures.py): a
    service or broker that does not answer is one line on stderr with exit 3 (no traceback), a request the
    Kafka broker refuses this principal is one line naming the command that grants it with exit 2
    (shared/kafka/authorization.py), and a reader that closed the pipe (`| head -1`) ends the command quietly
    with exit 141."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    try:
        rc = _main(argv)
    except BrokenPipeError:
        failures.quiet_stdout()
        return failures.EXIT_BROKEN_PIPE
    except SystemExit:  # argparse's --help and usage errors: their text may meet a closed pipe as well
        if not failures.flush_stdout():
            return failures.EXIT_BROKEN_PIPE
        raise
    except Exception as e:
        refusal = kafka_refusal(e)     # the broker refused this principal: its one line, for every command
        if refusal is not None:
            print(f"apprentice {command}: {refusal}", file=sys.stderr)
            return EXIT_STARTUP_ERROR
        line = None if command in SERVER_COMMANDS else failures.describe_unreachable(e, command)
        if line is None:
            raise
        print(f"apprentice {command}: {line}", file=sys.stderr)
        return failures.EXIT_UNREACHABLE
    return rc if failures.flush_stdout() else failures.EXIT_BROKEN_PIPE


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="apprentice", description="On-the-job learning for deployed LLMs.")
    parser.add_argument("-V", "--version", action="version", version=f"apprentice {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in BROKER_COMMANDS.items():
        sub.add_parser(name, help=cmd.help)
    sp = sub.add_parser("serve", help="run one service in the foreground")
    sp.add_argument("service", choices=SERVICES)
    for name, cmd in DELEGATED.items():
        sub.add_parser(name, help=cmd.help, add_help=False)

    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] in ("-V", "--version"):
        parser.parse_args(argv[:1])  # prints the version and exits 0
    command, rest = argv[0], argv[1:]
    asks_help = any(a in ("-h", "--help") for a in rest)
    if command not in ("serve", "demo") and not asks_help:
        # CLI commands talk to the running local stack (the endpoints `up` recorded in its home) as its
        # operator (its dev CA and key), unless flags or variables say otherwise.
        if command != "up":  # `up` binds what its own settings say, never a previous stack's record
            apply_stack_endpoints(default_home())
        devca.apply_stack_client_env(default_home())
    if command not in ("serve", "kafka", "keys") and not asks_help:
        # (`keys` writes into the directory it is given, never the broker's: no client variables for it)
        # ... and as a principal of the local broker (its generated credentials), unless the environment
        # sets Kafka security of its own: the operator's tools as `operator`, the demo (which creates its
        # namespace's topics and ACLs) as the broker's `admin` (SECURITY.md §4)
        apply_client_env(default_home(), ADMIN if command == "demo" else OPERATOR)
    if command in DELEGATED:
        return int(DELEGATED[command].run(rest) or 0)
    if command == "serve":
        ns = parser.parse_args(argv[:2])
        return int(SERVE[ns.service](argv[2:]) or 0)
    if command in BROKER_COMMANDS:
        return int(BROKER_COMMANDS[command].run(rest) or 0)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
