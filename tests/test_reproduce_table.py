"""`python -m interp.reproduce table`: one row per claim of each claims.json, the recorded verdicts of
reproductions not re-derived marked so, and bad input one line on stderr (no traceback)."""

import json

from interp.reproduce.table import main, markdown


def claims_file(tmp_path, name="parity", verdict="reproduces"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"name": name, "scale": "cpu", "claims": [
        {"quote": "A | claim " + "long " * 40, "verdict": verdict, "basis": "3 runs, seeds 0, 1, 2",
         "decides": "r 0.9", "interval": "[0.8, 0.95]", "rule": "in 3 of 3 seeds"}]}))
    return path


def test_one_row_per_claim_and_the_recorded_ones_marked(tmp_path):
    recorded = [{"reproduction": "retrieval cpu", "date": "2026-12-01",
                 "verdicts": [{"claim": "H3 fails", "verdict": "reproduces"}]}]
    lines = markdown([claims_file(tmp_path)], recorded).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| reproduction | claim | verdict")
    assert "| parity cpu | A \\| claim long" in lines[2] and "... | reproduces | 3 runs, seeds 0, 1, 2 | r 0.9 |" in lines[2]
    assert "| inconclusive |" in lines[3] and "recorded reproduces on 2026-12-01, runs not committed" in lines[3]
    assert "neither their seeds nor whether one was still rising can be checked" in lines[3]


def test_bad_input_is_one_line(tmp_path, capsys):
    for argv, code in ((["--help"], 2), ([], 2), (["--recorded"], 2), ([str(tmp_path / "missing.json")], 1),
                       (["--recorded", str(tmp_path / "none.json"), str(claims_file(tmp_path))], 1)):
        assert main(argv) == code
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, (argv, err)
    (tmp_path / "bad.json").write_text("{")
    assert main([str(tmp_path / "bad.json")]) == 1 and "JSONDecodeError" in capsys.readouterr().err
    assert main([str(claims_file(tmp_path))]) == 0 and "parity cpu" in capsys.readouterr().out
