"""Hardware presets by name or by the short alias users type (``h100``), each read as the
preset's one name everywhere: the library, the search space and the CLI."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from pykvpool.cli.argtypes import hardware_list
from pykvpool.errors import UnknownPresetError
from pykvpool.planning.hardware import HARDWARE, HARDWARE_ALIASES, hardware_name, hardware_preset
from pykvpool.search.space import SearchSpace


def test_aliases_read_as_their_preset() -> None:
    for alias, name in HARDWARE_ALIASES.items():
        assert name in HARDWARE
        assert hardware_name(alias) == hardware_name(f" {alias.upper()} ") == name
        assert hardware_preset(alias) is HARDWARE[name]
    for name in HARDWARE:
        assert hardware_name(name) == name


def test_an_unknown_name_lists_names_and_aliases() -> None:
    with pytest.raises(UnknownPresetError, match="h100-sxm.*h100"):
        hardware_preset("b200")


def test_the_search_space_and_the_cli_keep_the_one_name() -> None:
    assert SearchSpace(hardware=("h100", "a100")).hardware == ("h100-sxm", "a100-80gb-sxm")
    parse = hardware_list()
    assert parse("h100,a100-80gb-sxm") == ["h100-sxm", "a100-80gb-sxm"]
    with pytest.raises(argparse.ArgumentTypeError):
        parse("h100,h100-sxm")  # one preset twice
    r = subprocess.run([sys.executable, "-m", "pykvpool.cli", "ledger", "--model", "llama-3-8b", "--hardware", "h100"],
                       capture_output=True, text=True, timeout=120)
    want = subprocess.run([sys.executable, "-m", "pykvpool.cli", "ledger", "--model", "llama-3-8b",
                           "--hardware", "h100-sxm"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == want.stdout, r.stderr
