"""Text that comes from a submission, made safe once, where it crosses into the grader.

Everything a submission's processes produce (their output, messages, tracebacks, the names they
report) passes through `clean` before the grader keeps it: valid UTF-8 whatever the bytes were
(lone surrogates and undecodable bytes become U+FFFD), control and escape characters shown as
visible escapes (`\\x1b`), never sent raw to a terminal or a file, and a capped length. Reports,
pages and terminals then never fail on, or obey, a submission's text. The instructor's own files
(cases, policy) are read with `read_utf8`, whose errors name the file and the line.
"""

from __future__ import annotations

import re

# C0 and C1 control characters, DEL, and the bidirectional-override characters that reorder what a
# reader sees; newline and tab are kept.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

DEFAULT_LIMIT = 64_000


def clean(text: str | bytes | None, limit: int = DEFAULT_LIMIT) -> str:
    """`text` as valid UTF-8 with control characters made visible, at most `limit` characters
    (the middle dropped, and how much said)."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        text = str(text)
    # Lone surrogates (os.fsdecode of bad bytes) cannot be encoded: replace them.
    text = text.encode("utf-8", errors="replace").decode("utf-8")
    text = text.replace("\r\n", "\n")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)
    if len(text) > limit:
        half = limit // 2
        text = f"{text[:half]}\n[... {len(text) - 2 * half} characters dropped ...]\n{text[-half:]}"
    return text


def clean_line(text: str | bytes | None, limit: int = 300) -> str:
    """One line of a submission's text (a name, an id): no line breaks either."""
    return clean(text, limit).replace("\n", " ").replace("\t", " ")


def headline(message: str | None) -> str:
    """A verdict's message as one line (the console, the verdict's summary): its first line, and
    the line after it when the first ends in ':' ("Remove them:" names nothing on its own)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    if not lines:
        return ""
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def read_utf8(path, error: type[Exception], what: str) -> str:
    """The text of a file the instructor wrote (cases, policy): a BOM, as Windows editors write
    one, is fine; a file that cannot be read, or a byte that is not UTF-8, raises `error` with the
    file, the line and the fix."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror}).") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise error(f"{path}:{line}: byte 0x{data[e.start]:02x} is not UTF-8; save the file as "
                    f"UTF-8.") from None
