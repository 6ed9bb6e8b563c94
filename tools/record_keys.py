"""A stack's home --> one Ed25519 record-signing key pair per principal that writes a topic (created once,
kept). The keys directory layout and rotation are in shared/kafka/signing.py; the principals, and which
topics each may sign, in shared/contracts/topic_access.py.

    .venv/bin/python -m tools.record_keys              # <home>/secrets/records
    .venv/bin/python -m tools.record_keys --dir /path

The local broker writes them when it starts (tools/broker/local_broker.py), and hands the directory to
every client of this home in `APPRENTICE_RECORD_KEYS_DIR`; run this by hand for keys elsewhere (a
deployment's secrets, before they are mounted).
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
    """The default keys directory of `home` (as `CommonSettings.record_keys_path` resolves it)."""
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
