"""`apprentice` command line: one entry point, sub-commands dispatched lazily (no torch on `--help`).

Commands (docs/architecture.md §9): kafka, topics, tail, serve, up, down, status, demo, weights, knowledge.
Service-specific commands live with their service (`services/<name>/cli.py`) and are imported only
when used.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

SERVICES = ("inference", "grader", "extractor", "trainer", "weights", "dashboard")

# command -> (module, function, help); the function takes the remaining argv.
DELEGATED: dict[str, tuple[str, str, str]] = {
    "weights": ("services.weights.cli", "main", "list / promote / rollback / status of model versions"),
    "knowledge": ("services.extractor.cli", "main", "show and curate the experiential knowledge bases"),
    "demo": ("tools.demo.cli", "main", "run the closed learning loop with simulated users"),
    "up": ("tools.stack.cli", "up", "start the broker and the five services as supervised processes"),
    "down": ("tools.stack.cli", "down", "stop the local stack"),
    "status": ("tools.stack.cli", "status", "health, versions, lag, spool depth of the local stack"),
    "secrets": ("tools.devca", "main", "create a stack's development CA, keys and tokens"),
    "env": ("tools.stack.client_env", "main",
            "print the shell lines that make stock clients trust the local stack: eval \"$(apprentice env)\""),
    "dashboard": ("services.dashboard.__main__", "main", "the operator dashboard: what the model is learning (web)"),
    "grader": ("services.grader.cli", "main", "set, list or delete a tenant's grading rules while the grader runs"),
}


def _delegate(module: str, func: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                print(f"apprentice: this command is not available in this build ({module} missing)", file=sys.stderr)
                return 2
            raise
        return int(getattr(mod, func)(argv) or 0)
    return run


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), or "unknown" when run from a bare tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apprentice")
    except PackageNotFoundError:
        return "unknown"


SERVER_COMMANDS = ("serve", "demo", "dashboard")
"""Commands that run servers or a whole stack: an error there is a bug or a crash to see in full, never worded
as "the stack is down"."""


def main(argv: list[str] | None = None) -> int:
    """Run one command. Two failures every command shares end here in one way (tools/cli/failures.py): a
    service or broker that does not answer is one line on stderr with exit 3 (no traceback), and a reader
    that closed the pipe (`| head -1`) ends the command quietly with exit 141."""
    from tools.cli.failures import (
        EXIT_BROKEN_PIPE,
        EXIT_UNREACHABLE,
        describe_unreachable,
        flush_stdout,
        quiet_stdout,
    )

    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    try:
        rc = _main(argv)
    except BrokenPipeError:
        quiet_stdout()
        return EXIT_BROKEN_PIPE
    except SystemExit:  # argparse's --help and usage errors: their text may meet a closed pipe as well
        if not flush_stdout():
            return EXIT_BROKEN_PIPE
        raise
    except Exception as e:
        line = None if command in SERVER_COMMANDS else describe_unreachable(e, command)
        if line is None:
            raise
        print(f"apprentice {command}: {line}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return rc if flush_stdout() else EXIT_BROKEN_PIPE


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="apprentice", description="On-the-job learning for deployed LLMs.")
    parser.add_argument("-V", "--version", action="version", version=f"apprentice {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("kafka", help="local single-node KRaft broker: start | stop | status | fetch")
    sub.add_parser("topics", help="create (if missing) and list the Apprentice topics")
    sub.add_parser("tail", help="print a topic's records as JSON lines")
    sp = sub.add_parser("serve", help="run one service in the foreground")
    sp.add_argument("service", choices=SERVICES)
    for name, (_m, _f, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)

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
        from shared.contracts.stack_endpoints import apply_stack_endpoints
        from shared.settings import default_home
        from tools.devca import apply_stack_client_env

        if command != "up":  # `up` binds what its own settings say, never a previous stack's record
            apply_stack_endpoints(default_home())
        apply_stack_client_env(default_home())
    if command in DELEGATED:
        module, func, _ = DELEGATED[command]
        return _delegate(module, func)(rest)
    if command == "serve":
        ns = parser.parse_args(argv[:2])
        return _delegate(f"services.{ns.service}.__main__", "main")(argv[2:])
    if command in ("kafka", "topics", "tail"):
        from tools.cli import kafka_cmds
        return int(getattr(kafka_cmds, command)(rest))
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
