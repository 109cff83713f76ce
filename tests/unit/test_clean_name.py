"""clean_name's shortcut for names that are clean already gives what the lexical cleaning
gives, for any name."""

from __future__ import annotations

import posixpath

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pycrid.images.layer_paths import clean_name


def _lexical(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/")


@settings(max_examples=2000)
@given(st.lists(st.sampled_from(["a", "b.c", ".", "..", "", ".wh.x", "..d", "e..", "/"]),
                max_size=8).map("/".join) | st.text(alphabet="ab./\\x00", max_size=12))
@example("a/b/")
@example("")
@example("/")
@example("./a")
@example("a/./b")
def test_clean_name_is_the_lexical_cleaning(name: str) -> None:
    assert clean_name(name) == _lexical(name)
