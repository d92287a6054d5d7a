"""The one table REPRODUCTIONS.md opens with (issue 37 item 5), generated from the reproductions' claims.json:

    python -m interp.reproduce table [--recorded FILE] CLAIMS.json ... > table.md
    markdown(claims_files, recorded=None) -> str

One row per claim of each claims.json given (an `interp reproduce NAME --scale S` output, e.g. with
--no-train from the committed runs): the reproduction and scale, the claim (its first words), the verdict,
the runs and seeds behind it, the number that decides it, its interval and the verdict rule's reason
(interp.reproduce.verdicts). Reproductions whose runs are not here (not committed, never rerun) come from
`recorded` (a JSON list of {"reproduction", "date", "verdicts": [{"claim", "verdict"}]}: the verdicts
REPRODUCTIONS.md recorded when the runs existed). Under the verdict rule such a claim is "inconclusive":
with no runs here neither its seeds nor whether a run was still rising can be checked; the recorded
verdict is its "decided by" ("recorded X on DATE, runs not committed")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("reproduction", "claim", "verdict", "runs and seeds", "decided by", "interval", "why (the verdict rule)")
QUOTE = 90   # characters of the claim's sentence shown


def _cell(text) -> str:
    return " ".join(str(text or "-").split()).replace("|", "\\|")


def _short(quote: str) -> str:
    return quote if len(quote) <= QUOTE else quote[:QUOTE].rsplit(" ", 1)[0] + " ..."


def rows(claims_files, recorded=None) -> list[dict[str, str]]:
    out = []
    for path in claims_files:
        saved = json.loads(Path(path).read_text())
        where = f"{saved['name']} {saved['scale']}"
        for c in saved["claims"]:
            out.append({"reproduction": where, "claim": _short(c["quote"]), "verdict": c["verdict"],
                        "runs and seeds": c.get("basis", ""), "decided by": c.get("decides", ""),
                        "interval": c.get("interval", ""), "why (the verdict rule)": c.get("rule", "")})
    for entry in recorded or []:
        for c in entry["verdicts"]:
            out.append({"reproduction": entry["reproduction"], "claim": _short(c["claim"]), "verdict": "inconclusive",
                        "runs and seeds": c.get("runs", ""),
                        "decided by": f"recorded {c['verdict']} on {entry['date']}, runs not committed", "interval": "",
                        "why (the verdict rule)": "inconclusive: the runs are not here, so neither their seeds nor "
                        "whether one was still rising can be checked (rerun to re-derive); "
                        + entry.get("note", "")})
    return out


def markdown(claims_files, recorded=None) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in COLUMNS) + " |" for row in rows(claims_files, recorded)]
    return "\n".join(lines) + "\n"


USAGE = "usage: python -m interp.reproduce table [--recorded FILE] CLAIMS.json ..."


def main(argv: list[str]) -> int:
    """Print the table; a usage line (exit 2) for no claims or a flag it does not know, one line
    naming the file for a missing or unreadable file (exit 1)."""
    recorded = None
    if argv[:1] == ["--recorded"]:
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        recorded, argv = argv[1], argv[2:]
    if not argv or any(a.startswith("-") for a in argv):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        recorded = None if recorded is None else json.loads(Path(recorded).read_text())
        text = markdown(argv, recorded)
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        print(f"python -m interp.reproduce table: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
        return 1
    print(text, end="")
    return 0
