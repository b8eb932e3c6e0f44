"""A host's ``python`` field reaches the remote shell as words, never as commands of its own."""

import subprocess

import pytest

from core.client.launchers import LauncherError, from_host


def _remote(python: str) -> str:
    """The command ssh hands the remote shell for a host with this ``python`` field."""
    return from_host({"name": "gpu", "kind": "ssh", "dest": "me@gpu", "python": python}).argv[-1]


@pytest.mark.parametrize("tail", ["; touch {m}", " && touch {m}", " | touch {m}", " $(touch {m})", " `touch {m}`",
                                  "\ntouch {m}"], ids=["semicolon", "and", "pipe", "dollar", "backquote", "newline"])
def test_shell_syntax_in_the_python_field_runs_nothing(tmp_path, tail):
    marker = tmp_path / "ran"
    command = _remote("true" + tail.format(m=marker))
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert not marker.exists(), (command, done.stderr)


def test_a_word_with_a_semicolon_reaches_the_program_whole(tmp_path):
    command = _remote("printf [%s] one;two")
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.stdout == "[one;two][-m][core.worker]"


def test_interpreters_of_several_words_and_the_home_folder_are_kept():
    assert _remote("python3 -X dev") == "python3 -X dev -m core.worker"
    assert _remote("~/venv/bin/python").startswith("~/venv/bin/python -c ")
    assert _remote("conda run -n t python").startswith("conda run -n t python -c ")
    assert _remote("'/opt/my env/bin/python' -X dev") == "'/opt/my env/bin/python' -X dev -m core.worker"


def test_a_python_field_with_an_open_quote_is_refused_naming_the_field():
    with pytest.raises(LauncherError, match=r"^host 'gpu': 'python': No closing quotation in \"'python3\"$"):
        _remote("'python3")


def test_the_remote_home_is_still_expanded(tmp_path):
    command = _remote("printf [%s] ~/'my env'/bin/python")
    done = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.stdout == f"[{tmp_path}/my env/bin/python][-m][core.worker]"
