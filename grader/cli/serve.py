"""`python -m grader serve tokens`: the course check service's tokens (issue 33,
grader/service/tokens.py), one per roster student and the instructor's, issued, revoked and
reissued from the command line. What it prints says where the tokens are and what to do next."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.course.roster import RosterError, load_roster
from grader.service.store import Store
from grader.service.tokens import INSTRUCTOR_TOKEN, TOKENS_CSV, TokenError, issue, revoke


def add_arguments(sub) -> None:
    """The `serve` command and its actions (only `tokens` so far: the service itself is issue
    33's next part)."""
    sv = sub.add_parser("serve", help="the course check service's tokens (issue 33)")
    actions = sv.add_subparsers(dest="serve_command", required=True)
    tk = actions.add_parser("tokens", help="a token for each roster student without one (STORE/"
                                           f"{TOKENS_CSV}) and the instructor's; or --revoke one")
    tk.add_argument("--store", type=Path, required=True, help="the service's store folder")
    tk.add_argument("--roster", type=Path, help="course roster CSV (a 'folder' column)")
    tk.add_argument("--revoke", metavar="FOLDER", help="revoke this student's token at once")
    tk.add_argument("--reissue", action="store_true", help="with --revoke: and give a new one")


def serve_command(args: argparse.Namespace) -> int:
    if args.serve_command == "tokens":
        return _tokens(args)
    raise AssertionError(args.serve_command)


def _tokens(args: argparse.Namespace) -> int:
    if args.reissue and not args.revoke:
        return _error("--reissue goes with --revoke FOLDER (the student whose token to replace)")
    if not args.revoke and not args.roster:
        return _error("give --roster roster.csv (a token for each student without one) or "
                      "--revoke FOLDER")
    try:
        store = Store(args.store)
        if args.revoke:
            token = revoke(store, args.revoke, reissue=args.reissue)
            print(f"revoked {args.revoke}'s token: it stops working now"
                  + (f"; their new one is in {args.store / TOKENS_CSV}" if token else ""))
            return 0
        done = issue(store, load_roster(args.roster))
    except (RosterError, TokenError, OSError) as e:
        return _error(str(e))
    print(f"{len(done.new)} new token(s), {len(done.kept)} kept: one line per student in "
          f"{args.store / TOKENS_CSV} (folder, token), readable by you only; mail each student "
          f"their own line, or post it through the LMS")
    if done.instructor_new:
        print(f"the instructor's token: {args.store / INSTRUCTOR_TOKEN}")
    return 0


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
