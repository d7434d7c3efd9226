"""The `serve` settings reference in the docs is written from `ServeSettings`, and is current."""

from __future__ import annotations

from pathlib import Path

from tokentrail.cli import settings_doc
from tokentrail.cli.serve import ServeSettings
from tokentrail.cli.settings import fields_of

PAGE = Path(__file__).parent.parent / settings_doc.PAGE


def test_committed_page_is_current() -> None:
    assert PAGE.read_text("utf-8") == settings_doc.markdown(ServeSettings), (
        "docs/operating/settings-reference.md is stale: run python -m tokentrail.cli.settings_doc"
    )


def test_every_setting_has_its_row() -> None:
    page = settings_doc.markdown(ServeSettings)
    for f in fields_of(ServeSettings):
        (row,) = [line for line in page.splitlines() if f"`{f.env}`" in line]
        assert row.startswith(f"| `{f.flag}`"), row
        assert f.info.help.replace("|", "\\|") in row
        if f.has_unit():
            assert f"| {f.info.unit} |" in row


def test_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    stale = tmp_path / "settings-reference.md"
    stale.write_text(settings_doc.markdown(ServeSettings).replace("8300", "8301"), "utf-8")
    assert settings_doc.main(["--check", str(stale)]) == 1
    assert settings_doc.main([str(stale)]) == 0
    assert settings_doc.main(["--check", str(stale)]) == 0
