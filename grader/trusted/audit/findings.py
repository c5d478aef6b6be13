"""What the audit reports: a finding (where, what, which way in it is), for the Python audit
(allowlist) and the C++ one (reach) alike, and AuditUnavailable, raised when the grading machine
cannot read what a build made (a missing tool or record: the machine's failure, never a pass)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReachFinding:
    where: str     # 'submission.py line 3', or the object file's name
    what: str      # the name, import or symbol
    why: str       # which way in it is

    def describe(self) -> str:
        return f"{self.where}: {self.what[:120]} ({self.why})"


class AuditUnavailable(RuntimeError):
    """The grading machine cannot read what a build made (binutils' nm is missing, the build left
    no record of its headers)."""
