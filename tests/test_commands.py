"""Every command is both `python -m depthpack.CMD` and the console script depthpack-CMD: pyproject.toml's
[project.scripts] names exactly the commands, each entry resolves to a callable that reads sys.argv, and
each module run as `-m` answers --help with exit code 0."""
import importlib
import runpy
import sys
import warnings
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "eval", "export", "bench", "bag")


def scripts() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def entry(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_every_command_has_a_console_script_and_nothing_else():
    assert sorted(scripts()) == sorted(f"depthpack-{c}" for c in COMMANDS)


@pytest.mark.parametrize("name", sorted(f"depthpack-{c}" for c in COMMANDS))
def test_console_script_resolves_and_reads_its_arguments(name, monkeypatch, capsys):
    fn = entry(scripts()[name])
    assert callable(fn)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as e:  # the installed wrapper is sys.exit(fn()); --help exits inside it
        fn()
    assert e.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("cmd", COMMANDS)
def test_python_m_help_exits_0(cmd, monkeypatch, capsys):
    """What `python -m depthpack.CMD --help` runs (runpy, as the interpreter's -m does), in this process:
    a child interpreter per command spent 8 s importing torch again."""
    monkeypatch.setattr(sys, "argv", [f"depthpack.{cmd}", "--help"])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as e:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before it ran as __main__
        runpy.run_module(f"depthpack.{cmd}", run_name="__main__", alter_sys=True)
    assert e.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out
