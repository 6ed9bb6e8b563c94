"""`apprentice keys records`: writes, rotates, lists and retires record-signing keys in the directory it is
given, never in the local broker's (the CLI gives other commands the broker's client variables, keys
directory included: `keys` must not take them, or a rotation meant for a deployment's keys would replace
the local stack's). Real subprocesses of the installed entry point's module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shared.kafka.signing import load_signer

REPO = Path(__file__).resolve().parents[3]


def keys(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.cli.main", "keys", "records", *args], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)


def test_init_rotate_list_retire_in_the_given_directory(tmp_path: Path) -> None:
    d = tmp_path / "keys"
    assert keys("init", "--dir", str(d)).returncode == 0
    old = load_signer(d, "grader").key_id
    out = keys("rotate", "grader", env={"APPRENTICE_RECORD_KEYS_DIR": str(d)})   # the variable, not the broker's
    assert out.returncode == 0, out.stderr
    new = load_signer(d, "grader").key_id
    assert new != old and (d / f"grader@{old}.pub").exists() and (d / f"grader@{new}.pub").exists()
    listed = keys("--dir", str(d), "list").stdout
    assert f"grader: {old} {new}*" in listed or f"grader: {new}* {old}" in listed, listed
    refused = keys("retire", f"grader@{new}", "--dir", str(d))
    assert refused.returncode == 2 and "signs with now" in refused.stderr
    assert keys("retire", f"grader@{old}", "--dir", str(d)).returncode == 0
    assert not (d / f"grader@{old}.pub").exists()
