"""Reading code, not comments: a C++ or Python source as lines of code apart from their comments,
each with its nesting level, as hints_skeleton.py and hints_todos.py compare them (the student's
code against the kit's skeleton; grader/report/hints.py says how)."""

from __future__ import annotations

import ast
import dataclasses
import re


# ---------------------------------------------------------------- reading code, not comments


@dataclasses.dataclass(frozen=True)
class _Line:
    code: str          # the code, comments removed, whitespace collapsed ('' for none)
    comment: str       # the comment text on this line ('' for none)
    level: int         # nesting: brace depth (C++) or indentation (Python) where the line starts


def _cpp_lines(source: str) -> list[_Line]:
    """Each physical line split into code and comment; strings and characters are respected."""
    out, depth, in_block, openers, statement = [], 0, False, [], ""
    for raw in source.splitlines():
        code, comment, i, quote = [], [], 0, ""
        while i < len(raw):
            ch, two = raw[i], raw[i:i + 2]
            if in_block:
                if two == "*/":
                    in_block, i = False, i + 2
                    code.append(" ")
                    continue
                comment.append(ch)
            elif quote:
                code.append(ch)
                if ch == "\\" and i + 1 < len(raw):
                    code.append(raw[i + 1])
                    i += 1
                elif ch == quote:
                    quote = ""
            elif two == "//":
                comment.append(raw[i + 2:])
                break
            elif two == "/*":
                in_block, i = True, i + 2
                continue
            else:
                if ch in "\"'":
                    quote = ch
                code.append(ch)
            i += 1
        text = " ".join("".join(code).split())
        closing = len(text) - len(text.lstrip("}"))
        level = depth - closing
        key = text
        if text:
            # A closing brace is known by the statement that opened its block (all its lines: a
            # kernel's signature ends alike in every kernel): alone, every `}` looks alike, and
            # the comparison could pair the skeleton's with any of the student's.
            statement = f"{statement} {text}".strip()
            stripped = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'', "", text)
            for n, ch in enumerate(c for c in stripped if c in "{}"):
                if ch == "{":
                    openers.append(statement)
                else:
                    opener = openers.pop() if openers else ""
                    if n == 0 and closing:
                        key = f"{text} <{opener}>"
            depth += stripped.count("{") - stripped.count("}")
            if text.endswith((";", "{", "}")) or text.startswith("#"):
                statement = ""
        out.append(_Line(key, "".join(comment), level))
    # `template <int D>` alone is every template's first line: it is known by the next one
    code_rows = [row for row, line in enumerate(out) if line.code]
    for row, nxt in zip(code_rows, code_rows[1:]):
        if re.fullmatch(r"template\s*<.*>", out[row].code):
            out[row] = dataclasses.replace(out[row], code=f"{out[row].code} {out[nxt].code}")
    return out


def _python_lines(source: str) -> list[_Line]:
    """Logical lines (a bracketed expression over several physical lines is one, at its first
    line), code and comment apart; the level is the indentation, Python's nesting. Source that
    does not tokenize is read line by line, '#' starting a comment."""
    import io
    import tokenize
    physical = source.splitlines()
    indent = [len(raw) - len(raw.lstrip()) for raw in physical]
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out = []
        for row, raw in enumerate(physical):
            code, _, comment = raw.partition("#")
            text = " ".join(code.split())
            out.append(_Line(text, comment, indent[row]))
        return out
    code: dict[int, list[str]] = {}     # first row of a logical line -> its tokens
    comment: dict[int, str] = {}
    start = None
    skip = (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            comment[tok.start[0] - 1] = tok.string[1:]
            continue
        if tok.type in skip:
            continue
        if tok.type == tokenize.NEWLINE:
            start = None
            continue
        if start is None:
            start = tok.start[0] - 1
        code.setdefault(start, []).append(tok.string)
    return [_Line(" ".join(code.get(row, [])), comment.get(row, ""), indent[row])
            for row in range(len(physical))]


def _is_python(source: str) -> bool:
    try:
        ast.parse(source)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):   # any text a student sends
        return False
