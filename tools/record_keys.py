"""A stack's home --> one Ed25519 record-signing key pair per principal that writes a topic (created once,
kept), and their rotation. The keys directory layout and the rotation scheme are in
shared/kafka/signing.py; the principals, and which topics each may sign, in shared/contracts/topic_access.py.

    apprentice keys records init                   # <home>/secrets/records (the missing pairs)
    apprentice keys records init --dir /path       # a deployment's keys, before they are mounted
    apprentice keys records rotate grader          # a new pair for grader; its old .pub stays trusted
    apprentice keys records list                   # every public key, by principal
    apprentice keys records retire grader@<key_id> # delete an old .pub once its records are past retention
    python -m tools.record_keys layout /record-keys # compose: one folder per principal (compose/docker-compose.yml)
    apprentice keys records helm-values --dir keys  # the Helm chart's recordKeys.publicKeys (values YAML)

(`python -m tools.record_keys ...` is the same without the `apprentice keys` prefix.)

The local broker writes them when it starts (tools/broker/local_broker.py), and hands the directory to
every client of this home in `APPRENTICE_RECORD_KEYS_DIR`; a stack against a broker of the user's own gets
them from the supervisor (tools/stack/supervisor.py). Rotation steps: docs/operations.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.contracts.topic_access import PRINCIPALS, TABLE
from shared.kafka.signing import init_keys, key_id_of, private_key_path
from shared.settings import default_home

SIGNERS: tuple[str, ...] = tuple(sorted({w for access in TABLE for w in access.writers}))
"""Every principal some topic accepts records from: each needs a key pair (readers only need the .pub)."""


def records_dir(home: Path) -> Path:
    """The default keys directory of `home` (as `CommonSettings.record_keys_path` resolves it)."""
    return home / "secrets" / "records"


def ensure(directory: Path) -> list[str]:
    """Write the missing key pairs under `directory`; the principals written."""
    return init_keys(directory, SIGNERS)


def rotate(directory: Path, principal: str) -> str:
    """A new key pair for `principal`: the new `.pub` is written first, then the private key is replaced
    atomically (rename), so a producer restarted at any moment signs with a key its consumers can already
    verify once they reload. The old `.pub` is kept (records it signed stay verifiable) until `retire`.
    Returns the new key id."""
    if principal not in SIGNERS:
        raise ValueError(f"{principal!r} writes no topic (signers: {', '.join(SIGNERS)})")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = Ed25519PrivateKey.generate()
    pub = private.public_key()
    key_id = key_id_of(pub)
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (directory / f"{principal}@{key_id}.pub").write_text(raw.hex() + "\n")
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    target = private_key_path(directory, principal)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.replace(tmp, target)
    return key_id


def public_keys(directory: Path) -> dict[str, list[str]]:
    """The key ids trusted per principal (every `<principal>@<key_id>.pub`), and which one signs now."""
    out: dict[str, list[str]] = {}
    for path in sorted(directory.glob("*@*.pub")):
        principal, key_id = path.stem.split("@", 1)
        out.setdefault(principal, []).append(key_id)
    return out


def current_key_id(directory: Path, principal: str) -> str | None:
    """The key id of `principal`'s private key in `directory` (None when this directory has none)."""
    path = private_key_path(directory, principal)
    if not path.exists():
        return None
    private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(private, Ed25519PrivateKey)
    return key_id_of(private.public_key())


def retire(directory: Path, name: str) -> Path:
    """Delete the public key `<principal>@<key_id>`; refused for the key the principal signs with now."""
    principal, _, key_id = name.removesuffix(".pub").partition("@")
    path = directory / f"{principal}@{key_id}.pub"
    if not key_id or not path.exists():
        raise ValueError(f"no public key {name!r} in {directory}")
    if current_key_id(directory, principal) == key_id:
        raise ValueError(f"{principal}@{key_id} is the key {principal} signs with now: rotate first")
    path.unlink()
    return path


MASTER = "_pairs"
"""The folder of a `layout` root that holds every key pair; only the init job that writes it mounts it."""


def layout(root: Path) -> list[str]:
    """Compose's keys volume: every key pair in `root/_pairs` (written once, kept; `rotate --dir
    root/_pairs` rotates there), and per principal a folder `root/<principal>` holding its own private key
    (signers only) and every public key, so each container mounts its own folder alone (a volume subpath)
    as its APPRENTICE_RECORD_KEYS_DIR: no container can read another's private key. Run again after a
    rotation or a retirement: the folders are rewritten from `_pairs` (a retired .pub leaves every folder).
    Returns the principals whose pair was created now."""
    master = root / MASTER
    written = ensure(master)
    pubs = {p.name: p.read_bytes() for p in master.glob("*@*.pub")}
    for principal in PRINCIPALS:
        folder = root / principal
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        for stale in folder.glob("*@*.pub"):
            if stale.name not in pubs:
                stale.unlink()
        for name, data in pubs.items():
            _replace(folder / name, data, 0o644)
        own = private_key_path(master, principal)
        if own.exists():
            _replace(private_key_path(folder, principal), own.read_bytes(), 0o600)
    return written


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write `path` whole or not at all (a container stopped half-way never leaves a truncated key)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def helm_values(directory: Path) -> str:
    """The Helm chart's `recordKeys.publicKeys` for the public keys in `directory` (values YAML): public
    keys go in values (a ConfigMap), private keys only in Secrets (deploy/helm/apprentice/README.md)."""
    lines = ["recordKeys:", "  publicKeys:"]
    for path in sorted(directory.glob("*@*.pub")):
        lines.append(f"    {path.stem}: \"{path.read_text().strip()}\"")  # quoted: all-digit hex is no number
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`[records] init | rotate PRINCIPAL | list | retire PRINCIPAL@KEY_ID` (`init` when none is given)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["records"]:  # `apprentice keys records ...`: record-signing keys (the only kind yet)
        args_in = args_in[1:]
    if args_in[:1] == ["layout"] and len(args_in) == 2:
        written = layout(Path(args_in[1]))
        print(f"{args_in[1]}: one folder per principal; new key pairs: {', '.join(written) or 'none'}")
        return 0
    if not any(a in ("init", "rotate", "list", "retire", "helm-values", "-h", "--help") for a in args_in):
        args_in = [*args_in, "init"]  # `python -m tools.record_keys [--dir D]`: write the missing pairs
    ap = argparse.ArgumentParser(prog="apprentice keys records", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="keys directory (default <home>/secrets/records)")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("init", help="write the missing key pairs")
    sp = sub.add_parser("rotate", help="a new key pair for one principal (its old .pub stays trusted)")
    sp.add_argument("principal", choices=SIGNERS)
    sub.add_parser("list", help="the trusted public keys per principal, '*' marking the signing one")
    sub.add_parser("helm-values", help="the Helm chart's recordKeys.publicKeys for these keys (YAML)")
    sp = sub.add_parser("retire", help="delete an old public key <principal>@<key_id>")
    sp.add_argument("key")
    # --dir is accepted before or after the action
    args, extra = ap.parse_known_args(args_in)
    if extra:
        more = argparse.ArgumentParser(add_help=False)
        more.add_argument("--dir", type=Path, default=None)
        rest, unknown = more.parse_known_args(extra)
        if unknown:
            ap.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.dir = rest.dir or args.dir
    directory: Path = args.dir or Path(os.environ.get("APPRENTICE_RECORD_KEYS_DIR") or records_dir(default_home()))
    try:
        if args.action == "init":
            written = ensure(directory)
            print(f"{directory}: wrote {', '.join(written) if written else 'nothing (every key pair exists)'}")
        elif args.action == "rotate":
            key_id = rotate(directory, args.principal)
            print(f"{directory}: {args.principal} now signs with {args.principal}@{key_id}; ship "
                  f"{args.principal}@{key_id}.pub to every consumer, restart {args.principal}, and retire the "
                  "old .pub once its records are past every consumer's retention (docs/operations.md)")
        elif args.action == "list":
            for principal, ids in public_keys(directory).items():
                now = current_key_id(directory, principal)
                print(f"{principal}: " + " ".join(f"{k}{'*' if k == now else ''}" for k in ids))
        elif args.action == "helm-values":
            print(helm_values(directory), end="")
        else:
            print(f"deleted {retire(directory, args.key)}")
    except ValueError as e:
        print(f"apprentice keys: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
