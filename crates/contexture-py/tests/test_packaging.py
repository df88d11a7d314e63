"""What the installed package holds: one native module for the stable ABI, type hints,
and Python sources that CPython 3.9 (the oldest the wheel serves) can read."""

import ast
import importlib.metadata
import pathlib

import contexture
from contexture import _native

PACKAGE = pathlib.Path(contexture.__file__).parent


def test_the_native_module_is_built_for_the_stable_abi():
    assert pathlib.Path(_native.__file__).name.endswith(".abi3.so")
    assert importlib.metadata.metadata("contexture")["Requires-Python"] == ">=3.9"
    assert contexture.__version__ == importlib.metadata.version("contexture")


def test_type_hints_ship_with_the_package():
    assert (PACKAGE / "py.typed").exists()
    stub = (PACKAGE / "_native.pyi").read_text()
    for name in ("count_tokens", "count_messages", "fit", "validate", "repair", "convert",
                 "class Template", "class Thread", "class Store", "parse_output", "eval_condition"):
        assert name in stub, name
    # Every native function and class the stub names is there, and the other way round.
    names = {node.name for node in ast.parse(stub).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    exported = {name for name in dir(_native) if not name.startswith("_")}
    assert names == exported


def test_the_python_sources_read_as_python_3_9():
    for source in PACKAGE.rglob("*.py"):
        ast.parse(source.read_text(), filename=str(source), feature_version=(3, 9))


def test_every_public_name_has_a_docstring():
    for name in contexture.__all__:
        value = getattr(contexture, name)
        if callable(value):
            assert value.__doc__, name
