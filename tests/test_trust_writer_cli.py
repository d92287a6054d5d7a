"""Issue 38 item 1 from the command line: `ln -s ../victim RUN/circuit.csv; interp circuit RUN`
overwrote the victim with the CSV (pandas to_csv follows the link); the same with patch.csv and
`interp patch`. Now every output goes through models.storage.writer: a link at an output is replaced by
the file, as the HTML reports already were (a rename replaces the link itself), and what it
pointed to is left as it was."""

import os

import pandas as pd
import pytest

from interp.cli import main
from test_cli_patch import trained


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("links"), model="transformer")


COMMANDS = {
    "circuit": ["--n", "8", "--steps", "2", "--rescore", "3", "--no-progress"],
    "patch": ["--n", "4", "--top", "2"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_links_at_the_outputs_are_replaced_and_their_targets_untouched(run_dir, tmp_path, command):
    victims = {}
    for suffix in (".csv", ".html"):
        output = run_dir / f"{command}{suffix}"
        victims[output] = tmp_path / f"victim{suffix}"
        victims[output].write_text("precious\n")
        output.unlink(missing_ok=True)
        output.symlink_to(os.path.relpath(victims[output], run_dir))   # ln -s ../../victim RUN/circuit.csv
    assert main([command, str(run_dir), *COMMANDS[command]]) == 0
    for output, victim in victims.items():
        assert victim.read_text() == "precious\n", f"{victim} was written through the link {output}"
        assert output.is_file() and not output.is_symlink()
    table = pd.read_csv(run_dir / f"{command}.csv")
    assert len(table) > 0 and ("edge" in table.columns if command == "circuit" else "method" in table.columns)
