"""What the subject reports, checked (the harness, grader/trusted/harness.py): its reply lines
parsed as JSON with finite numbers only, and every field the harness reads given its type and
bounds (counts, times, kernels launched, what a call returned); SubjectGone, the end of a subject
that died, hung or broke the protocol, and the protocol violation's wording."""

from __future__ import annotations

import json
import math
import os
import torch
from grader.common import config
from grader.common.text import clean


class SubjectGone(Exception):
    """The subject died, hung past its deadline, or broke the protocol."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# ---------------------------------------------------------------- what the subject reports, checked
#
# Invariant: nothing the subject reports is kept unchecked. A reply is JSON with no NaN, Infinity
# or overflowing number (1e999 would parse as inf), and every field the harness reads has its
# type and its bounds: a count is an integer (never a bool) from 0 to a cap, a time is finite, at
# least 0 and no longer than the calls it covers took by this process's clock, a size no larger
# than the device's memory. Anything else is a protocol violation: runtime_error, naming the
# field and the value. (An infinite GPU time once explained any time at all:
# integrity._accounting subtracted it from the measured one.) The diagnostics line of a timed
# call is the one exception: it is only shown, never ranked or judged, so a bad number in it is
# dropped (Link._set_aside, _diagnostic_ms) rather than failing the call.


class _NotFinite(ValueError):
    """A NaN, an Infinity or a float literal that overflows, in a reply."""


def _no_constant(word: str):
    raise _NotFinite(word)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def parse_reply(line: bytes) -> dict:
    """One reply line as a JSON object with finite numbers only; SubjectGone otherwise. Python's
    json takes NaN and Infinity, and "1e999" as inf, unless told not to; a 5000-digit integer
    or 100 000 nested lists raise errors that are not JSONDecodeError."""
    try:
        reply = json.loads(line, parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as e:
        try:   # which field: the line again, every float kept as written
            field = _not_finite_at(json.loads(line, parse_constant=_NotFinite, parse_float=_NotFinite))
        except (ValueError, RecursionError):
            field = ""
        raise _protocol(f"its reply's {field or 'number'} is {clean(str(e), 40)}: not a finite "
                        f"number") from None
    except (ValueError, RecursionError):   # JSONDecodeError, UnicodeDecodeError, digit limits
        raise _protocol("a reply that is not JSON (something wrote to the grader's pipe)") from None
    if not isinstance(reply, dict):
        raise _protocol("a reply that is not a JSON object (something wrote to the grader's pipe)")
    return reply


def _not_finite_at(value, path: str = "") -> str:
    """Where in a reply parsed with every float and constant kept as _NotFinite the first one
    that is not finite is ('launched[0][2]'); a float that is finite is let pass."""
    if isinstance(value, _NotFinite):
        try:
            return "" if math.isfinite(float(str(value))) else path
        except ValueError:   # NaN, Infinity and -Infinity are constants float() also reads
            return path
    items = (value.items() if isinstance(value, dict) else enumerate(value)
             if isinstance(value, list) else ())
    for key, item in items:
        where = _not_finite_at(item, f"{path}.{key}" if isinstance(key, str) and path
                               else key if isinstance(key, str) else f"{path}[{key}]")
        if where:
            return where
    return ""


def _protocol(what: str) -> SubjectGone:
    return SubjectGone("runtime_error", f"the subject broke the protocol: {what}")


def malformed(field: str, value, why: str) -> SubjectGone:
    """The protocol violation of a reply whose `field` holds `value`, which it may not (`why`)."""
    shown = clean(json.dumps(value) if not isinstance(value, str) else repr(value), 120)
    return _protocol(f"its reply's {field} is {shown}: {why}")


def number(value, field: str, *, high: float, integer: bool = False, unit: str = ""):
    """`value` when it is a number (an integer where `integer`; never a bool), finite and within
    [0, high]; else a protocol violation naming the field."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise malformed(field, value, f"not {kind}")
    if isinstance(value, float) and not math.isfinite(value) or not 0 <= value <= high:
        raise malformed(field, value, f"not {kind} from 0 to {high:.6g}{unit}")
    return value


def launched(raw, field: str, window_ms: float) -> list[list]:
    """The subject's list of [name, count, GPU µs], checked (number) and its names cleaned. It
    covers `window_ms` by this process's clock: a call (from the request to its reply), or the
    timed loop (from "profile on" to the reply to "profile off"), and no kernel runs longer than
    that, nor launches more often than config.REPORT_LAUNCHES_PER_MS. A claim:
    grader/trusted/integrity.py weighs it."""
    if not isinstance(raw, list) or len(raw) > config.REPORT_KERNELS:
        raise malformed(field, raw if not isinstance(raw, list) else f"a list of {len(raw)}",
                        f"not a list of at most {config.REPORT_KERNELS} [name, count, GPU µs]")
    launches = config.REPORT_LAUNCH_FLOOR + config.REPORT_LAUNCHES_PER_MS * window_ms
    longest_us = 1e3 * (window_ms * (1 + config.REPORT_CLOCK_SLACK) + config.REPORT_CLOCK_SLACK_MS)
    out = []
    for i, item in enumerate(raw):
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
            raise malformed(f"{field}[{i}]", item, "not a [name, count, GPU µs]")
        name = clean(item[0], 300).replace("\n", " ")
        count = number(item[1], f"{field}[{i}] count ({name[:80]})", high=launches, integer=True,
                       unit=f" (launches in the {window_ms:.1f} ms the report covers)")
        us = number(item[2], f"{field}[{i}] GPU µs ({name[:80]})", high=longest_us,
                    unit=f" µs: no kernel runs longer than the {window_ms:.3f} ms, by the "
                         f"grader's clock, that the report covers")
        out.append([name, count, float(us)])
    return out


def returned_description(raw) -> dict:
    """What a call returned, as the subject describes it (subject/loop.py describe): its type's
    name, and for a tensor its shape (at most 8 dimensions) and dtype; checked."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise malformed("returned", raw, "not a description of what the call returned")
    if raw["type"] != "Tensor":
        return dict(type=raw["type"])
    shape = raw.get("shape")
    if not isinstance(shape, list) or len(shape) > 8:
        raise malformed("returned.shape", shape, "not a list of at most 8 sizes")
    sizes = [number(x, f"returned.shape[{i}]", high=2 ** 40, integer=True) for i, x in enumerate(shape)]
    if not isinstance(raw.get("dtype"), str):
        raise malformed("returned.dtype", raw.get("dtype"), "not a dtype's name")
    return dict(type="Tensor", shape=sizes, dtype=raw["dtype"])


def memory_bytes(device: str) -> int:
    """The most memory a process can have used on `device`: the GPU's, or this machine's."""
    if device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _error_text(reply: dict, doing: str = "") -> str:
    """An error the subject reported, as the student reads it: '[doing: ]Type: message', then
    its traceback, which the subject cut to the student's own frames (subject/loop.py,
    student_traceback). All of it the subject's claim: cleaned and capped, never parsed."""
    text = f"{clean(reply.get('error'), 200)}: {clean(reply.get('message'), 4000)}"
    if doing:
        text = f"{doing}: {text}"
    if reply.get("traceback"):
        text += "\n" + clean(reply["traceback"], 6000)
    return text
