"""`interp sweep --help` says what executes code: a .py spec runs when loaded, a spec's trial
"module:function" imports that module in the driver and every worker (before: undocumented)."""

import pytest

from interp.cli import main


def test_sweep_help_documents_code_execution(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "A spec runs code; run only specs you trust" in text
    assert "a .py spec is executed as Python" in text
    assert '"trial": "module:function" imports that module' in text and "every worker" in text
