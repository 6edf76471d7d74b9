"""The figures page (``benches/RESULTS.md``) agrees with its records (``benches/results/``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benches import results_page
from benches.results_page import ALLOWLIST, PAGE, RECORDS, check, load_records, main


def _copy_page(tmp_path: Path) -> Path:
    page = tmp_path / "RESULTS.md"
    shutil.copy(PAGE, page)
    return page


def test_the_page_is_checked_against_its_records() -> None:
    assert check(PAGE.read_text(encoding="utf-8"), load_records()) == []
    assert main(["--check"]) == 0


def test_a_table_cell_edited_by_hand_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = _copy_page(tmp_path)
    text = page.read_text(encoding="utf-8")
    cell = "| 1.009 (0.993-1.025) |"
    assert text.count(cell) == 1
    page.write_text(text.replace(cell, "| 1.019 (0.993-1.025) |"), encoding="utf-8")
    assert main(["--check", "--page", str(page)]) == 1
    out = capsys.readouterr().out
    assert "hardening.short.bf16" in out and "quoted by no record" in out


def test_a_headline_edited_by_hand_fails_and_write_restores_it(tmp_path: Path) -> None:
    page = _copy_page(tmp_path)
    original = page.read_text(encoding="utf-8")
    page.write_text(original.replace("| **157x** |", "| **160x** |", 1), encoding="utf-8")
    assert main(["--check", "--page", str(page)]) == 1
    assert main(["--write", "--page", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == original
    assert main(["--check", "--page", str(page)]) == 0


def test_a_changed_record_fails_the_check(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    shutil.copytree(RECORDS, folder)
    records = json.loads((folder / "video.json").read_text(encoding="utf-8"))
    assert records[0]["id"] == "video.block8.pages_held"
    records[0]["figure"] = "2,926"
    (folder / "video.json").write_text(json.dumps(records), encoding="utf-8")
    problems = check(PAGE.read_text(encoding="utf-8"), load_records(folder), folder)
    assert any("video.block8.pages_held" in p for p in problems)


def test_records_carry_every_key_and_unique_ids(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    rec = {key: "x" for key in results_page.KEYS}
    (folder / "a.json").write_text(json.dumps([rec, rec]), encoding="utf-8")
    with pytest.raises(ValueError, match="repeated id"):
        load_records(folder)
    del rec["machine"]
    (folder / "a.json").write_text(json.dumps([rec]), encoding="utf-8")
    with pytest.raises(ValueError, match="missing machine"):
        load_records(folder)


def test_every_allowlist_entry_gives_a_reason() -> None:
    assert all(isinstance(reason, str) and reason.strip() for reason in ALLOWLIST.values())
