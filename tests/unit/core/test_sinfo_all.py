"""Every ``sinfo`` the provider sends sees hidden partitions (``-a``/``--all``).

Plain ``sinfo`` leaves out partitions with ``Hidden=YES``: a job on one would find no node of its
partition (an infrastructure resubmission failed "leaves 0 node(s)"). The command builders that send
sinfo are found by reading ``core/commands`` with :mod:`ast`, so a new builder without sample
arguments below fails here, and every sinfo in every form of every builder must carry ``-a``. No
other string of the package spells a sinfo without it either.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao_slurm.core import commands

PACKAGE = Path(commands.__file__).resolve().parents[2]
#: ``sinfo`` followed by an option, in any string of the package (a command line, not prose).
SINFO_COMMAND_RE = re.compile(r"(?<![\w./-])sinfo\s+-")
#: Where a sinfo invocation starts in a command line.
SINFO_WORD_RE = re.compile(r"(?<![\w./-])sinfo(?=\s)")

#: Each builder that sends sinfo and the arguments of each of its forms.
SINFO_BUILDERS: dict[str, list[tuple[Any, ...]]] = {
    "sinfo_partitions": [()],
    "sinfo_partitions_cached": [(None, 600), ("/lustre/u/.cache/partitions", 600, "/lustre/u")],
    "existing_nodes": [("n1",), ("n[1-2],gpu3",)],
    "node_states": [()],
}


def _strings(body: list[ast.stmt]) -> list[str]:
    return [
        node.value
        for stmt in body
        for node in ast.walk(stmt)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _body(function: ast.FunctionDef) -> list[ast.stmt]:
    """A function's statements without its docstring."""
    return function.body[1:] if ast.get_docstring(function) is not None else function.body


def _calls(body: list[ast.stmt]) -> set[str]:
    return {
        node.func.id
        for stmt in body
        for node in ast.walk(stmt)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }


def sinfo_builders() -> dict[str, Callable[..., str]]:
    """Every function of ``core/commands`` that puts sinfo in a command: the word ``"sinfo"`` as an argv item,
    a sinfo command in a string, or a call of such a function."""
    functions: dict[str, tuple[Callable[..., str], list[ast.stmt]]] = {}
    for info in pkgutil.iter_modules(commands.__path__):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        tree = ast.parse(inspect.getsource(module))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                functions[node.name] = (getattr(module, node.name), _body(node))
    found = {
        name
        for name, (_, body) in functions.items()
        if any(text == "sinfo" or SINFO_COMMAND_RE.search(text) for text in _strings(body))
    }
    while True:  # builders that call a builder
        more = {name for name, (_, body) in functions.items() if name not in found and _calls(body) & found}
        if not more:
            return {name: functions[name][0] for name in sorted(found)}
        found |= more


def sinfo_invocations(command: str) -> list[list[str]]:
    """The words of each sinfo in a shell command line, up to the end of its simple command."""
    invocations = []
    for match in SINFO_WORD_RE.finditer(command):
        lexer = shlex.shlex(command[match.end() :], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for word in lexer:
            if word and set(word) <= set(";&|()<>"):
                break
            words.append(word)
        invocations.append(words)
    return invocations


def sees_hidden(words: list[str]) -> bool:
    """Whether sinfo's options include ``-a``/``--all`` (alone or among combined short flags)."""
    return any(word == "--all" or re.fullmatch(r"-[A-Za-z]*a[A-Za-z]*", word) for word in words)


def test_every_sinfo_builder_has_sample_arguments() -> None:
    assert set(sinfo_builders()) == set(SINFO_BUILDERS), (
        "a command builder sends sinfo: add it to SINFO_BUILDERS with the arguments of each of its forms"
    )


@pytest.mark.parametrize(
    ("name", "args"), [pytest.param(name, args, id=name) for name, forms in SINFO_BUILDERS.items() for args in forms]
)
def test_every_sinfo_sees_hidden_partitions(name: str, args: tuple[Any, ...]) -> None:
    command = sinfo_builders()[name](*args)

    invocations = sinfo_invocations(command)

    assert invocations, f"{name}{args} sends no sinfo: {command}"
    for words in invocations:
        assert sees_hidden(words), f"{name}{args}: sinfo {' '.join(words)} leaves hidden partitions out"


def test_no_string_of_the_package_spells_a_sinfo_without_it() -> None:
    """Outside the builders too (a command spelt by hand, a fix a message suggests): docstrings aside."""
    plain = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and ast.get_docstring(node) is not None
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                words = sinfo_invocations(node.value) if SINFO_COMMAND_RE.search(node.value) else []
                plain += [f"{path.relative_to(PACKAGE)}: {node.value!r}" for w in words if not sees_hidden(w)]
    assert plain == []


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        pytest.param("sinfo -h -N -o '%N|%P|%t'", False, id="plain"),
        pytest.param("sinfo -a -h -o '%P|%l|%G'", True, id="dash-a"),
        pytest.param("sinfo --all -h", True, id="long"),
        pytest.param("sinfo -ahN -o %N", True, id="combined"),
        pytest.param("x=$(sinfo -a -h) && y=$(sinfo -h -N) || exit", False, id="second-without"),
        pytest.param("sinfo -h -o '%P -a' -p polar", False, id="a-inside-a-quoted-format"),
    ],
)
def test_the_check_bites(command: str, expected: bool) -> None:
    assert all(sees_hidden(words) for words in sinfo_invocations(command)) is expected
