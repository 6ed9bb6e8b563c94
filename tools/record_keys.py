"""A stack's home --> one Ed25519 record-signing key pair per principal that writes a topic (created once,
kept). The keys directory layout and rotation are in shared/kafka/signing.py; the principals, and which
topics each may sign, in shared/contracts/topic_access.py.

    .venv/bin/python -m tools.record_keys              # <home>/secrets/records
    .venv/bin/python -m tools.record_keys --dir /path

Run by hand for now: `apprentice up`, the demo and the tests' session do not call it yet, and no service signs or
checks records yet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.contracts.topic_access import TABLE
from shared.kafka.signing import init_keys
from shared.settings import default_home

SIGNERS: tuple[str, ...] = tuple(sorted({w for access in TABLE for w in access.writers}))
"""Every principal some topic accepts records from: each needs a key pair (readers only need the .pub)."""


def records_dir(home: Path) -> Path:
    return home / "secrets" / "records"


def ensure(directory: Path) -> list[str]:
    """Write the missing key pairs under `directory`; the principals written."""
    return init_keys(directory, SIGNERS)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="keys directory (default <home>/secrets/records)")
    args = ap.parse_args(argv)
    directory = args.dir or records_dir(default_home())
    written = ensure(directory)
    print(f"{directory}: wrote {', '.join(written) if written else 'nothing (every key pair exists)'}")


if __name__ == "__main__":
    main()
