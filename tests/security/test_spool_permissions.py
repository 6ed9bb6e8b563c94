"""Attack: another local account reads captured prompts from the inference spool (files were 0644 under
the usual umask 022). The spool directory must be 0700 and every file in it 0600, whatever the umask, and
a spool left readable by an older version is tightened when the service opens it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.inference.spool import Spool


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)            # the most permissive umask: modes come from the code alone
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_spool_files_are_private_to_the_service(tmp_path: Path, open_umask: None) -> None:
    d = tmp_path / "spool"
    s = Spool(d, segment_bytes=64, cursor_interval_s=0)
    for i in range(5):                                   # rotates segments, saves the cursor
        s.append("interactions", b"k", b"my email is jane.doe@example.com %d" % i)
    s.flush()
    while (r := s.next_record()) is not None:
        s.ack(r.seq)
    s.close()
    assert _mode(d) == 0o700
    files = list(d.iterdir())
    assert any(f.suffix == ".seg" for f in files) and any(f.name == "cursor" for f in files)
    assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}


def test_a_readable_spool_is_tightened_on_open(tmp_path: Path, open_umask: None) -> None:
    d = tmp_path / "spool"
    s = Spool(d)
    s.append("interactions", b"k", b"call me on +44 20 7946 0958")
    s.close()
    os.chmod(d, 0o755)                                   # as an older version left it
    for f in d.iterdir():
        os.chmod(f, 0o644)
    Spool(d).close()
    assert _mode(d) == 0o700
    assert all(_mode(f) == 0o600 for f in d.iterdir())
