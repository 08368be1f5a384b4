"""
Journaled saves (`realm_hf.io.staged_saves`) and the loads that complete them (`realm_hf.io.consistent_reads`): a
journal found in the folder that only holds an output moves nothing but that output.
"""

import json

import pytest

from realm_hf.io.consistent_reads import consistent_read
from realm_hf.io.staged_saves import JOURNAL_NAME, STAGING_PREFIX, replace_directory


def _plant(parent, replace, remove=()):
    staging = parent / f"{STAGING_PREFIX}planted"
    staging.mkdir()
    for name in replace:
        (staging / name).mkdir()
    (parent / JOURNAL_NAME).write_text(
        json.dumps({"staging": staging.name, "replace": list(replace), "remove": list(remove)})
    )


def test_replace_directory_refuses_a_journal_naming_siblings(tmp_path):
    (tmp_path / "sibling.txt").write_text("keep me")
    _plant(tmp_path, ["x"], ["sibling.txt"])
    with pytest.raises(OSError, match="sibling.txt"):
        with replace_directory(tmp_path / "x") as folder:
            (tmp_path / folder / "new.txt").write_text("new")
    assert (tmp_path / "sibling.txt").read_text() == "keep me"
    assert not (tmp_path / "x").exists()


def test_a_load_refuses_a_journal_in_the_parent_naming_siblings(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "data.txt").write_text("x")
    (tmp_path / "sibling.txt").write_text("keep me")
    _plant(tmp_path, ["x"], ["sibling.txt"])
    with pytest.raises(OSError, match="sibling.txt"):
        with consistent_read(str(tmp_path / "x")):
            pass
    assert (tmp_path / "sibling.txt").read_text() == "keep me"


def test_an_interrupted_swap_of_the_output_alone_is_still_completed(tmp_path):
    (tmp_path / "sibling.txt").write_text("keep me")
    _plant(tmp_path, ["x"])
    (tmp_path / f"{STAGING_PREFIX}planted" / "x" / "new.txt").write_text("new")
    with consistent_read(str(tmp_path / "x")):
        assert (tmp_path / "x" / "new.txt").read_text() == "new"
    assert not (tmp_path / JOURNAL_NAME).exists()
    assert (tmp_path / "sibling.txt").read_text() == "keep me"
