"""The contract's atomic writes: a reader sees the old file or the new one, never half."""
import os

import pytest

from hcp_tune.spec import atomic_open, atomic_write_text


def test_atomic_open_replaces_only_when_the_block_ends_cleanly(tmp_path):
    path = tmp_path / "trials.csv"
    atomic_write_text(str(path), "old\n")
    with pytest.raises(RuntimeError):
        with atomic_open(str(path), "wb") as out:
            out.write(b"half of the new")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"  # untouched
    assert os.listdir(tmp_path) == ["trials.csv"]  # the partial file is gone
    with atomic_open(str(path), "wb") as out:
        out.write(b"new\n")
        assert path.read_text() == "old\n"  # not replaced before the block ends
    assert path.read_text() == "new\n"
