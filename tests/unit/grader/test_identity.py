"""Worker identity: one slot per live process, the same slot again after a crash, or the instance id."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

from services.grader.identity import claim_identity


def test_slots_are_exclusive_and_reused_once_free(tmp_path: Path) -> None:
    a = claim_identity("app", "", tmp_path)
    b = claim_identity("app", "", tmp_path)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    assert (a.name, b.name) == (f"{host}-0", f"{host}-1")
    a.release()
    c = claim_identity("app", "", tmp_path)
    assert c.name == a.name  # a restarted worker gets its old name (and transactional id) back
    b.release()
    c.release()


def test_a_process_that_ends_without_cleanup_frees_its_slot(tmp_path: Path) -> None:
    code = ("import os, pathlib; from services.grader.identity import claim_identity; "
            f"print(claim_identity('app', '', pathlib.Path({str(tmp_path)!r})).name, flush=True); os._exit(0)")
    held = claim_identity("app", "", tmp_path)  # slot 0 taken here
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip().endswith("-1"), out.stderr
    held.release()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip().endswith("-0"), out.stderr


def test_instance_id_wins(tmp_path: Path) -> None:
    assert claim_identity("app", "pod-3", tmp_path).name == "pod-3"
