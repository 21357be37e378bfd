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


# ---- issue 24: temporaries that never look valid and never pile up ------------------------------------

from refgpt.files.atomic_write import AtomicFile, is_temporary, remove_stale  # noqa: E402


def test_a_target_name_of_name_max_bytes_works_and_errors_name_it(tmp_path):
    """A legal name never fails because its temporary's would be too long: the temporary is then
    named by the name's first bytes and a hash of all of it."""
    long = "é" * 127 + "x"  # 255 bytes in UTF-8: the longest name ext4 allows
    out = write_atomically(tmp_path / long, lambda tmp: tmp.write_text("ok"))
    assert out.read_text() == "ok" and os.listdir(tmp_path) == [long]

    def fails(tmp):
        assert is_temporary(tmp) and len(os.fsencode(tmp.name)) <= 255
        raise OSError(28, "No space left on device", str(tmp))

    with pytest.raises(RefGPTError) as error:
        write_atomically(tmp_path / long, fails)
    assert str(error.value) == f"'{tmp_path / long}': cannot write (No space left on device)"
    assert ".refgpt-" not in str(error.value) and os.listdir(tmp_path) == [long]


def test_the_next_writer_removes_a_killed_writers_temporary_but_never_a_live_ones(tmp_path):
    target = tmp_path / "g.safetensors"
    live = AtomicFile(target)  # a writer at work: its temporary is flocked
    stale = tmp_path / f".g.safetensors.refgpt-tmp-{'0' * 12}"  # a killed writer's: nobody holds it
    stale.write_bytes(b"half")
    write_atomically(target, lambda tmp: tmp.write_text("new"))
    assert not stale.exists() and live.tmp.exists()
    live.abort()
    assert sorted(os.listdir(tmp_path)) == ["g.safetensors"]
    remove_stale(target)  # nothing to do, and nothing else touched
    assert target.read_text() == "new"


def test_every_reader_refuses_a_temporary_by_name(tmp_path):
    from refgpt.files.safetensors_file import SafetensorsWriter, SafetensorsFile
    from refgpt.oracle import golden, llmc

    import numpy as np

    real = tmp_path / "x.safetensors"
    with SafetensorsWriter(real, {"x": (np.float64, (2,))}) as out:
        out.write("x", np.ones(2))
    hidden = tmp_path / f".x.safetensors.refgpt-tmp-{'a' * 12}"
    hidden.write_bytes(real.read_bytes())
    for read in (SafetensorsFile, golden.read, llmc.read_model, llmc.read_tokenizer):
        with pytest.raises(RefGPTError, match="a temporary file of a refgpt writer that never finished"):
            read(hidden)
