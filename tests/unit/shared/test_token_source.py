"""The client's bearer key from a mounted file: concurrent first calls (a thread pool starting its
requests together) all present the key; none goes out without one."""

from __future__ import annotations

import threading
from pathlib import Path

from shared.security.channels import TokenSource


def test_concurrent_first_calls_all_get_the_key(tmp_path: Path) -> None:
    key_file = tmp_path / "operator.token"
    key_file.write_text("s3cret-key\n")
    for _ in range(20):  # fresh sources: the race is on the first read
        source = TokenSource(file=key_file)
        start = threading.Barrier(16)
        got: list[str] = []

        def call(src: TokenSource = source, barrier: threading.Barrier = start, out: list[str] = got) -> None:
            barrier.wait()
            out.append(src())

        threads = [threading.Thread(target=call) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == ["s3cret-key"] * 16


def test_rotated_key_is_picked_up_and_a_missing_file_keeps_the_last(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_text("one")
    source = TokenSource(file=key_file)
    assert source() == "one"
    key_file.write_text("two-longer")
    source._checked -= 2.0  # a second has passed (no sleeping in tests)
    assert source() == "two-longer"
    key_file.unlink()
    source._checked -= 2.0
    assert source() == "two-longer"
