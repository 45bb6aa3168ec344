"""Memory files never follow a link inside their folder: a topic file, a lock file or (below
a root) a folder that is a link sends no read and no write outside it; a FIFO hangs no
reader; a folder name the system cannot take is InvalidInputError.

Each runs twice where it can: through the folder's descriptor (POSIX), and on paths (the
fallback where there are no descriptor-relative calls), whose checks are the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

import mnemo
from mnemo.memoryfiles import _folder

SECRET = "The root password is hunter2.\n"


@pytest.fixture(params=["descriptors", "paths"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways `Folder` reaches files: relative to the folder's descriptor, or by path."""
    if request.param == "paths":
        monkeypatch.setattr(_folder, "RELATIVE", False)
    return str(request.param)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the memory directory, holding a secret file."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.md").write_text(SECRET)
    return folder


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_a_topic_file_that_is_a_link_is_neither_read_nor_written_through(
    tmp_path: Path, outside: Path, mode: str
) -> None:
    """A topic file planted as a link to a file outside is not listed or recalled (its
    target was read and copied into the folder, then shown to the agent); a write to that
    topic replaces the link with a file of its own, and the target stays as it was."""
    memory = tmp_path / "memory"
    memory.mkdir()
    os.symlink(outside / "secret.md", memory / "nginx-port.md")
    files = mnemo.MemoryFiles(memory)
    assert files.list() == []
    assert await files.recall("root password") == []
    written = await files.persist("Remember the nginx port is 8443.", llm=None)
    assert "hunter2" not in written.content
    assert all("hunter2" not in f.content for f in files.list())
    assert (outside / "secret.md").read_text() == SECRET
    assert listing(outside) == ["secret.md"]


async def test_a_folder_below_the_root_that_is_a_link_is_refused(
    tmp_path: Path, outside: Path, mode: str
) -> None:
    """Below a root, a sub-folder that is a link (to a folder outside) is InvalidInputError
    for persist, list and recall, and nothing is written outside (the MCP server wrote
    there); a deeper folder under a link is refused too, and a real sub-folder works."""
    root = tmp_path / "memory"
    root.mkdir()
    os.symlink(outside, root / "evil")
    for directory in (root / "evil", root / "evil" / "deeper"):
        files = mnemo.MemoryFiles(directory, root=root)
        with pytest.raises(mnemo.InvalidInputError, match="link"):
            await files.persist("Remember the nginx port is 8443.", llm=None)
        with pytest.raises(mnemo.InvalidInputError, match="link"):
            files.list()
        with pytest.raises(mnemo.InvalidInputError, match="link"):
            await files.recall("root password")
    assert listing(outside) == ["secret.md"]
    real = mnemo.MemoryFiles(root / "team" / "ops", root=root)
    await real.persist("Remember the nginx port is 8443.", llm=None)
    assert [f.topic for f in real.list()] != []
    assert (root / "team" / "ops").is_dir()


def test_a_directory_outside_its_root_is_refused(tmp_path: Path) -> None:
    """A directory that is not inside its root, or climbs out with '..', is refused."""
    with pytest.raises(mnemo.InvalidInputError, match="inside"):
        mnemo.MemoryFiles(tmp_path / "elsewhere", root=tmp_path / "memory")
    with pytest.raises(mnemo.InvalidInputError, match=r"\.\."):
        mnemo.MemoryFiles(tmp_path / "memory" / ".." / "x", root=tmp_path / "memory")


async def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(
    tmp_path: Path, outside: Path, mode: str
) -> None:
    """A lock file planted as a link to a file outside makes the write fail (ELOOP), and the
    target is neither truncated nor written."""
    memory = tmp_path / "memory"
    memory.mkdir()
    os.symlink(outside / "secret.md", memory / ".memoryfiles.writer.lock")
    files = mnemo.MemoryFiles(memory)
    with pytest.raises(OSError, match="symbolic link"):
        await files.persist("Remember the nginx port is 8443.", llm=None)
    assert (outside / "secret.md").read_text() == SECRET


async def test_a_fifo_planted_as_a_topic_file_hangs_no_reader(tmp_path: Path) -> None:
    """A FIFO named like a topic file is skipped: list, recall and persist return (opening it
    to read blocked until a writer came)."""
    memory = tmp_path / "memory"
    memory.mkdir()
    os.mkfifo(memory / "trap.md")
    files = mnemo.MemoryFiles(memory)
    with anyio.fail_after(10):
        assert files.list() == []
        assert await files.recall("trap") == []
        await files.persist("Remember the nginx port is 8443.", llm=None)
    assert [f.path.name for f in files.list()] != ["trap.md"]


@pytest.mark.parametrize(
    ("directory", "match"),
    [("memory\x00x", "NUL"), ("x" * 300, "name of 300 bytes"), ("a/" * 2_100, "4,095")],
)
def test_a_folder_name_the_system_cannot_take_is_invalid_input(
    tmp_path: Path, directory: str, match: str
) -> None:
    """A NUL (a raw ValueError), a name past 255 bytes or a path past 4,095 bytes (a raw
    OSError) is InvalidInputError when the MemoryFiles is made."""
    with pytest.raises(mnemo.InvalidInputError, match=match):
        mnemo.MemoryFiles(tmp_path / directory)
