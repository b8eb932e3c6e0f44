"""show() writes its traces where no other user can read, guess or redirect them."""

import os
import stat
import tempfile

import pytest

from core.client.show_link import private_folder, write_private

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_show_does_not_follow_links_planted_at_its_paths(temp_root, monkeypatch):
    torch = pytest.importorskip("torch")
    import backprop_studio

    monkeypatch.delenv("BACKPROP_STUDIO_WORKER", raising=False)
    victim = temp_root / "victim.txt"
    victim.write_text("keep me", encoding="utf-8")
    old = temp_root / "backprop-studio-show"  # the names show() used to write, planted as links
    old.mkdir()
    for n in range(1, 50):
        (old / f"show-{os.getpid()}-{n}.json").symlink_to(victim)
    elsewhere = temp_root / "elsewhere"
    elsewhere.mkdir()
    (temp_root / f"backprop-studio-{os.getuid()}").symlink_to(elsewhere)

    x = torch.tensor([2.0], requires_grad=True)
    paths = [backprop_studio.show(x * 3, open_window=False) for _ in range(3)]

    assert victim.read_text(encoding="utf-8") == "keep me"
    assert list(elsewhere.iterdir()) == []
    assert len(set(paths)) == 3
    for path in paths:
        info = os.lstat(path)
        assert stat.S_ISREG(info.st_mode) and _mode(path) == 0o600 and info.st_uid == os.getuid()
        folder = os.path.dirname(path)
        assert not os.path.islink(folder) and _mode(folder) == 0o700 and os.lstat(folder).st_uid == os.getuid()
        assert os.path.basename(path) not in {f"show-{os.getpid()}-{n}.json" for n in range(1, 50)}
        with open(path, encoding="utf-8") as f:
            assert '"MulBackward0"' in f.read()


def test_the_user_folder_is_private_and_reused(temp_root):
    folder = private_folder()
    assert folder == temp_root / f"backprop-studio-{os.getuid()}" and _mode(folder) == 0o700
    assert private_folder() == folder
    path = write_private("{}")
    assert os.path.dirname(path) == str(folder) and _mode(path) == 0o600


def test_a_folder_others_can_enter_is_not_used(temp_root):
    shared = temp_root / f"backprop-studio-{os.getuid()}"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    folder = private_folder()
    assert folder != shared and folder.parent == temp_root and _mode(folder) == 0o700
    path = write_private("{}")
    assert not path.startswith(str(shared) + os.sep) and list(shared.iterdir()) == []


def test_the_window_socket_is_in_the_private_folder(temp_root, monkeypatch):
    from core.client.show_link import address

    monkeypatch.delenv("BACKPROP_STUDIO_SOCKET", raising=False)
    sock = address()
    assert sock == str(temp_root / f"backprop-studio-{os.getuid()}" / "show.sock")
    assert _mode(os.path.dirname(sock)) == 0o700
