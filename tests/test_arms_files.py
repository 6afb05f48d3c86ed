"""The file tool: reading inside allowed roots, refusing everything else, finding file requests in text."""

from __future__ import annotations

import os

import pytest

from surprisegate.arms.files import extract_file_request, file_evidence, read_file, resolve_path
from surprisegate.arms.toolkit import ToolRefused


@pytest.fixture
def root(tmp_path):
    allowed = tmp_path / "allowed"
    (allowed / "data").mkdir(parents=True)
    (allowed / "notes.txt").write_text("alpha\nbeta\ngamma\n", encoding="utf-8")
    (allowed / "data" / "config.toml").write_text("debug = true\n", encoding="utf-8")
    return allowed


def _refusal(path, roots, **kwargs) -> ToolRefused:
    with pytest.raises(ToolRefused) as caught:
        read_file(path, roots, **kwargs)
    return caught.value


def test_reads_a_relative_path_inside_the_root(root):
    contents = read_file("notes.txt", [root])
    assert contents.text == "alpha\nbeta\ngamma\n"
    assert contents.line_count == 3
    assert contents.size == 17
    assert not contents.truncated
    assert contents.real_path == str(root / "notes.txt")


def test_reads_nested_and_absolute_paths_inside_the_root(root):
    assert read_file("data/config.toml", [root]).text == "debug = true\n"
    assert read_file("./data/config.toml", [root]).text == "debug = true\n"
    assert read_file(str(root / "notes.txt"), [root]).line_count == 3


def test_looks_in_each_root_in_turn(root, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "only-here.txt").write_text("here", encoding="utf-8")
    assert read_file("only-here.txt", [root, other]).text == "here"


def test_symlinks_that_stay_inside_the_root_are_followed(root):
    (root / "link.txt").symlink_to(root / "notes.txt")
    assert read_file("link.txt", [root]).text.startswith("alpha")


def test_reads_are_bounded(root):
    (root / "big.txt").write_text("x" * 10_000, encoding="utf-8")
    contents = read_file("big.txt", [root], max_bytes=100)
    assert contents.text == "x" * 100
    assert contents.truncated
    assert contents.size == 10_000


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../secret.txt", "parent_escape"),
        ("data/../../secret.txt", "parent_escape"),
        ("~/secret.txt", "home_path"),
        ("/etc/passwd", "outside_roots"),
        ("missing.txt", "not_found"),
        ("", "bad_path"),
        ("a\x00b", "bad_path"),
        ("data", "not_regular"),
    ],
)
def test_refusals(root, path, reason):
    refusal = _refusal(path, [root])
    assert refusal.reason == reason
    assert str(refusal)  # every refusal says why


def test_refusal_messages_name_the_path_and_the_roots(root):
    message = str(_refusal("../secret.txt", [root]))
    assert "'../secret.txt'" in message and "'..'" in message and str(root) in message


def test_symlink_escape_is_refused(root, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET", encoding="utf-8")
    (root / "innocent.txt").symlink_to(secret)
    refusal = _refusal("innocent.txt", [root])
    assert refusal.reason == "symlink_escape"
    assert "TOPSECRET" not in str(refusal)


def test_symlinked_directory_escape_is_refused(root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOPSECRET", encoding="utf-8")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    assert _refusal("linked/secret.txt", [root]).reason == "symlink_escape"
    assert _refusal(str(root / "linked" / "secret.txt"), [root]).reason == "symlink_escape"


def test_binary_files_and_fifos_are_refused(root):
    (root / "blob.txt").write_bytes(b"\x00\x01\x02")
    assert _refusal("blob.txt", [root]).reason == "binary"
    os.mkfifo(root / "pipe.txt")
    assert _refusal("pipe.txt", [root]).reason == "not_regular"  # and it did not hang


def test_no_roots_means_no_reading(root):
    assert _refusal("notes.txt", []).reason == "no_roots"


def test_a_root_that_is_itself_a_symlink_works(root, tmp_path):
    (tmp_path / "root-link").symlink_to(root, target_is_directory=True)
    assert read_file("notes.txt", [tmp_path / "root-link"]).text.startswith("alpha")
    assert resolve_path("notes.txt", [str(tmp_path / "root-link")])[1] == root


@pytest.mark.parametrize(
    ("text", "path", "lines"),
    [
        ("What are the contents of /etc/hosts?", "/etc/hosts", False),
        ("What is in file config.toml?", "config.toml", False),
        ("How many lines are in ./data/notes.txt?", "./data/notes.txt", True),
        ("What's in `notes.txt; rm -rf /`?", "notes.txt; rm -rf /", False),
        ("Show me data/notes.txt", "data/notes.txt", False),
        ('What does "my notes.txt" say?', "my notes.txt", False),
    ],
)
def test_extract_file_request(text, path, lines):
    request = extract_file_request(text)
    assert request is not None
    assert (request.path, request.wants_line_count) == (path, lines)


@pytest.mark.parametrize("text", ["", "What is 37 times 48?", "Read me a poem", "What's in `sorted([3,1,2])`?"])
def test_no_file_request(text):
    assert extract_file_request(text) is None


def test_file_evidence(root):
    evidence = file_evidence(read_file("notes.txt", [root]), field_name="question")
    assert evidence.source == "tool:files"
    assert evidence.observable == 1.0
    assert evidence.evidence == "The file notes.txt (3 lines, 17 bytes) contains:\nalpha\nbeta\ngamma\n"
    assert evidence.detail["tool"] == "files"
    assert evidence.detail["input"] == "notes.txt"
    assert evidence.detail["sandbox"] == "allowed-roots"
    counted = file_evidence(read_file("notes.txt", [root]), wants_line_count=True)
    assert counted.evidence == "The file notes.txt has 3 lines."
    assert counted.detail["output"] == "3"
