"""supported_architectures: every converter's source classes, with what each maps and refuses;
the README's table lists each of them."""

from pathlib import Path

import pytest

import models
from models.interop.registry import CONVERTERS, NOTES


def test_every_converter_has_its_notes_and_nothing_else_does():
    assert set(NOTES) == set(CONVERTERS)
    for model_type, (supports, refuses) in NOTES.items():
        assert supports.strip() and refuses.strip(), model_type


def test_details_describe_exactly_the_listed_classes():
    names = models.supported_architectures()
    details = models.supported_architectures(details=True)
    assert list(details) == names == sorted(names)
    for name, entry in details.items():
        assert name in CONVERTERS[entry["model_type"]][1]
        assert (entry["supports"], entry["refuses"]) == NOTES[entry["model_type"]]
    with pytest.raises(TypeError, match="details must be a bool"):
        models.supported_architectures(details="yes")


def test_the_readme_table_lists_every_supported_class():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("### Imported architectures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {cell.strip().strip("`") for row in rows for cell in row.split("|")[1].split(",")}
    assert listed == set(models.supported_architectures())
