"""Safe writes: a temporary file beside the target, renamed into place; links written through;
non-regular targets refused; a failed write leaves the old file and no temporary."""

from __future__ import annotations

import os
import stat

import pytest

from fuzzing import socket_file
from refgpt import RefGPTError
from refgpt.files.atomic_write import write_atomically


def test_a_new_file_is_written_and_no_temporary_is_left(tmp_path):
    write_atomically(tmp_path / "a.txt", lambda tmp: tmp.write_text("hello"))
    assert (tmp_path / "a.txt").read_text() == "hello" and os.listdir(tmp_path) == ["a.txt"]


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    write_atomically(tmp_path / "link.txt", lambda tmp: tmp.write_text("new"))
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new"


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    (tmp_path / "a.txt").write_text("old")
    os.chmod(tmp_path / "a.txt", 0o640)
    write_atomically(tmp_path / "a.txt", lambda tmp: tmp.write_text("new"))
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o640


@pytest.mark.parametrize("target,match", [
    ("socket", "not a regular file"),
    ("dir", "it is a directory"),
])
def test_a_non_regular_target_is_refused(tmp_path, target, match):
    (tmp_path / "dir").mkdir()
    socket_file(tmp_path / "socket")
    with pytest.raises(RefGPTError, match=match):
        write_atomically(tmp_path / target, lambda tmp: tmp.write_text("x"))
    assert not (tmp_path / target).is_file()


def test_a_link_to_a_non_regular_file_is_refused(tmp_path):
    (tmp_path / "dev").symlink_to(socket_file(tmp_path / "socket"))
    with pytest.raises(RefGPTError, match="a link to '.*socket'.*not a regular file"):
        write_atomically(tmp_path / "dev", lambda tmp: tmp.write_text("x"))
    assert (tmp_path / "dev").is_symlink() and stat.S_ISSOCK(os.stat(tmp_path / "socket").st_mode)


def test_a_failed_write_keeps_the_old_file(tmp_path):
    (tmp_path / "a.txt").write_text("old")

    def half(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(RefGPTError, match=r"'.*a.txt': cannot write \(disk full\)"):
        write_atomically(tmp_path / "a.txt", half)
    assert (tmp_path / "a.txt").read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]


def test_a_missing_directory_is_one_line(tmp_path):
    with pytest.raises(RefGPTError, match="does not exist"):
        write_atomically(tmp_path / "no" / "a.txt", lambda tmp: tmp.write_text("x"))
