"""Private PyTorch APIs go through vspyre.compat only, every hook resolves on the installed torch,
and a missing one names itself and the torch version."""

import ast
from pathlib import Path

import pytest
import torch

from vspyre import compat

SRC = Path(compat.__file__).parent
ALLOWED = {"_ops", "_C"}        # OpOverload's type and torch's C module: core, not a private API


def _private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch._"):
            if node.module.split(".")[1] not in ALLOWED:
                found.append(f"{path.name}:{node.lineno} from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.startswith("torch._") and a.name.split(".")[1] not in ALLOWED]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch"
              and node.attr.startswith("_") and not node.attr.startswith("__") and node.attr not in ALLOWED):
            found.append(f"{path.name}:{node.lineno} torch.{node.attr}")
    return found


def test_no_module_but_compat_uses_private_torch_apis():
    uses = [u for p in sorted(SRC.rglob("*.py")) if p.name != "compat.py" for u in _private_uses(p)]
    assert uses == [], "private torch APIs outside vspyre.compat: " + "; ".join(uses)


@pytest.mark.parametrize("name", sorted(compat.HOOKS))
def test_every_hook_resolves_on_this_torch(name):
    assert compat.get(name) is not None


def test_a_missing_hook_names_itself_and_the_torch_version(monkeypatch):
    monkeypatch.setitem(compat.HOOKS, "gone", compat.Hook("torch._inductor.codegen.common", "NoSuchClass",
                                                          "2.13", "an example"))
    with pytest.raises(compat.MissingHook, match=r"'gone'.*an example.*torch " + torch.__version__.replace("+", r"\+")):
        compat.get("gone")


def test_a_renamed_hook_is_found_under_its_other_name(monkeypatch):
    monkeypatch.setitem(compat.HOOKS, "moved", compat.Hook("torch._inductor.no_such_module", "V", "2.13", "example",
                                                           renamed=(("torch._inductor.virtualized", "V"),)))
    assert compat.get("moved") is compat.get("V")
