"""The ``vspyre`` command."""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  (autoloads the spyre device)

    from .harness import demo

    return demo.run()


def _cmd_hw(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import hardware

    cfg = hardware.PRESETS[args.preset] if args.preset else hardware.get_config()
    table = Table(title=f"hardware config '{cfg.name}'")
    for col in ("field", "value", "meaning", "source"):
        table.add_column(col)
    for name, value, doc, source in cfg.describe():
        table.add_row(name, str(value), doc, source)
    for name in ("usable_memory_bytes", "scratchpad_usable_bytes", "peak_fp16_flops", "core_memory_bandwidth"):
        table.add_row(name, f"{getattr(cfg, name):.6g}", "derived", "")
    Console().print(table)
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  (autoloads the spyre device)

    if args.backend != "standalone":
        print(f"vspyre ops: backend {args.backend!r} has no op listing here (known: standalone)")
        return 2
    from . import standalone

    for op, kind, how in standalone.op_table_rows():
        print(f"{op:60s} {kind:7s} {how}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vspyre", description="A virtual Spyre-class AI accelerator for PyTorch")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="run a tiny GPT-2 on the virtual card and print its report")
    p.set_defaults(fn=_cmd_demo)
    p = sub.add_parser("hw", help="print the hardware config (active, or a preset)")
    p.add_argument("--preset", choices=None, help="a preset name instead of the active config")
    p.set_defaults(fn=_cmd_hw)
    p = sub.add_parser("ops", help="list the ATen ops a compiler lowers natively")
    p.add_argument("--backend", default="standalone", help="which compiler (standalone)")
    p.set_defaults(fn=_cmd_ops)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
