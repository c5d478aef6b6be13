"""Text from a submission, made safe at the boundary."""

from grader.common.text import clean, clean_line


def test_lone_surrogates_and_bad_bytes_become_valid_utf8():
    import os
    text = clean("bad " + os.fsdecode(b"\xff") + " end")
    text.encode("utf-8")   # no UnicodeEncodeError
    assert clean(b"\xff\xfeok").endswith("ok")


def test_escape_codes_are_shown_not_obeyed():
    text = clean("\x1b[2J\x1b]0;title\x07red\u202eevil\r\nnext\tline")
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b[2J" in text and "\\u202e" in text and "\nnext\tline" in text


def test_length_is_capped_with_the_middle_dropped():
    text = clean("a" * 100 + "b" * 100, limit=50)
    assert text.startswith("a" * 25) and text.endswith("b" * 25) and "150 characters dropped" in text


def test_clean_is_idempotent_and_lines_have_no_breaks():
    once = clean("x\x1by")
    assert clean(once) == once
    assert clean_line("a\nb\tc") == "a b c"
