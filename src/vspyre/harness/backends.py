"""Backends as data: a name, a ``torch.compile`` backend (or None for eager) and a device.

Built in: ``eager-cpu``, ``inductor-cpu``, ``inductor-spyre``, ``standalone-spyre``. Any other
torch.compile backend on any device is given as ``COMPILER@DEVICE`` (``aot_eager@spyre``,
``eager@cpu``) or ``eager@DEVICE`` for plain eager (``none@spyre``), optionally with options
``COMPILER@DEVICE?mode=max-autotune&dynamic=true``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Backend:
    name: str
    compiler: str | None          # torch.compile backend name; None = eager (no compile)
    device: str                   # "cpu", "spyre", "spyre:1", ...
    options: dict[str, Any] = field(default_factory=dict, hash=False)   # more torch.compile kwargs

    def spec(self) -> dict[str, Any]:
        return asdict(self)


BUILTIN: dict[str, Backend] = {
    "eager-cpu": Backend("eager-cpu", None, "cpu"),
    "inductor-cpu": Backend("inductor-cpu", "inductor", "cpu"),
    "inductor-spyre": Backend("inductor-spyre", "inductor", "spyre"),
    "standalone-spyre": Backend("standalone-spyre", "spyre_standalone", "spyre"),
}
DEFAULT_BACKENDS = list(BUILTIN)


def _value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(v)
    except ValueError:
        return v


def parse_backend(text: str) -> Backend:
    """A built-in name, or ``COMPILER@DEVICE[?k=v&k=v]`` (COMPILER ``none`` = eager)."""
    text = text.strip()
    if text in BUILTIN:
        return BUILTIN[text]
    if "@" not in text:
        raise ValueError(f"unknown backend {text!r}: built in are {', '.join(BUILTIN)}; "
                         f"or give COMPILER@DEVICE, e.g. aot_eager@spyre")
    head, _, query = text.partition("?")
    compiler, _, device = head.partition("@")
    if not compiler or not device:
        raise ValueError(f"backend {text!r}: expected COMPILER@DEVICE")
    options = {}
    for kv in filter(None, query.split("&")):
        k, _, v = kv.partition("=")
        options[k] = _value(v)
    return Backend(text, None if compiler in ("none", "eager-mode") else compiler, device, options)


def parse_backends(text: str) -> list[Backend]:
    return [parse_backend(t) for t in text.split(",") if t.strip()]


def from_spec(name: str, spec: dict[str, Any]) -> Backend:
    return Backend(name, spec.get("compiler"), spec.get("device", "cpu"), dict(spec.get("options") or {}))


def backend_version(b: Backend) -> str:
    """The version of the code that compiles for this backend (recorded with every row)."""
    import torch

    import vspyre

    if b.compiler is None:
        return f"eager torch {torch.__version__}"
    if b.compiler == "spyre_standalone":
        return f"vspyre-standalone {vspyre.__version__}"
    if b.compiler == "inductor" and b.device.startswith("spyre"):
        return f"inductor torch {torch.__version__} + vspyre {vspyre.__version__}"
    return f"{b.compiler} torch {torch.__version__}"
