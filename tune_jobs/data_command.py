"""``lcfed data import`` (IDX files where torchvision reads them, LEAF JSON files into an .npz) and
``lcfed data stats`` (the partition a config makes, without training)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from lcfed.config import load_config
from lcfed.data import format_groups, format_stats, import_idx, import_leaf, partition_stats
from lcfed.errors import require
from lcfed.run.output_paths import check_output_dir
from lcfed.run.sources import check_against_data, load
from tune_jobs.options import add_actions, config_options, examples
from tune_jobs.run_command import partition_label


def add_parser(sub: Any) -> None:
    """Register ``lcfed data import`` and ``lcfed data stats`` on the CLI's subparsers."""
    data = sub.add_parser("data", help="dataset utilities", description="Dataset utilities: place IDX files where "
                          "torchvision expects them, turn LEAF's JSON files into an .npz, or print the partition a "
                          "config makes.",
                          epilog=examples("lcfed data import --from /tmp/mnist-idx",
                                          "lcfed data stats --config configs/mnist_dirichlet.yaml"))
    data_sub = add_actions(data, "data_command")
    imp = data_sub.add_parser(
        "import",
        help="place MNIST / Fashion-MNIST IDX files found on this machine where torchvision expects them, "
             "or merge LEAF JSON files into an .npz (--leaf)",
        description="Place MNIST / Fashion-MNIST IDX files (.gz or not) found on this machine where "
        "torchvision reads them under --data-dir, after checking each file (magic number, size, labels). "
        "With --leaf: merge LEAF's JSON files (FEMNIST, Synthetic, ...) into --data-dir/NAME.npz with each "
        "sample's user as its device id, for data.dataset=file and data.partition=natural.",
        epilog=examples("lcfed data import --data-dir ~/.cache/lcfed --from /tmp/mnist-idx",
                        "lcfed run --set data.dataset=mnist --set data.data_dir=~/.cache/lcfed   # then",
                        "lcfed data import --leaf leaf/data/femnist/data/train --leaf leaf/data/femnist/data/test "
                        "--name femnist",
                        "lcfed run --set data.dataset=file --set data.path=femnist.npz --set data.partition=natural"),
    )
    imp.add_argument("--data-dir", default="~/.cache/lcfed", help="destination data directory (default: %(default)s)")
    imp.add_argument(
        "--from",
        dest="sources",
        action="append",
        default=[],
        metavar="DIR",
        help="directory holding IDX files (.gz or not); repeatable. Default search: "
        "/usr/share/datasets/fashion-mnist and $LCFED_IDX_DIRS",
    )
    imp.add_argument("--leaf", action="append", default=[], metavar="PATH",
                     help="a LEAF JSON file or a directory of them (its *.json); repeatable: train and test files "
                          "are merged, the same user keeping one device id")
    imp.add_argument("--name", default="leaf", help="with --leaf: the .npz written under --data-dir is NAME.npz "
                                                     "(default: %(default)s)")
    imp.add_argument("--shape", default=None, metavar="C,H,W",
                     help="with --leaf: read each sample as an image of this shape, values in [0, 1] (default: 784 "
                          "values are FEMNIST's 1,28,28; other lengths stay feature vectors)")
    imp.set_defaults(func=cmd_data_import)
    stats = data_sub.add_parser(
        "stats", help="print the config's partition: train/test sizes and classes per device (what a run starts with)",
        description="Partition the config's dataset as a run would and print the devices' train/test sizes "
        "and classes per device, without training.",
        epilog=examples("lcfed data stats --config configs/mnist_dirichlet.yaml",
                        "lcfed data stats --set data.partition=pathological --set data.classes_per_device=2"),
    )
    config_options(stats)
    stats.set_defaults(func=cmd_data_stats)


def cmd_data_stats(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set)
    ds = load(cfg)
    part = check_against_data(cfg, ds)
    print(f"{partition_label(cfg)}:\n  {format_stats(partition_stats(part, ds.y))}")
    if part.group_kind:  # a testbed's known clusters: each device's true group
        print(f"  {format_groups(part)}")
    return 0


def cmd_data_import(args: argparse.Namespace) -> int:
    check_output_dir(args.data_dir, "--data-dir")
    if args.leaf:
        return _import_leaf(args)
    require(args.shape is None and args.name == "leaf", "--shape" if args.shape is not None else "--name",
            args.shape if args.shape is not None else args.name, "is read with --leaf only")
    placed = import_idx(Path(args.data_dir).expanduser(), args.sources)
    for name, dest in placed:
        print(f"{name}: {dest}")
    print(f"use with: --set data.data_dir={Path(args.data_dir).expanduser()}")
    return 0


def _import_leaf(args: argparse.Namespace) -> int:
    """``lcfed data import --leaf``: LEAF JSON files -> ``--data-dir/NAME.npz`` with device ids."""

    require(not args.sources, "--from", args.sources, "reads IDX files; give it or --leaf (LEAF JSON), not both")
    require(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", args.name) is not None, "--name", args.name,
            "must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (it names the .npz file)")
    shape = None
    if args.shape is not None:
        parts = args.shape.replace("x", ",").split(",")
        require(len(parts) == 3 and all(p.strip().isdigit() and int(p) > 0 for p in parts), "--shape", args.shape,
                "must be C,H,W: three positive integers, e.g. 1,28,28")
        shape = tuple(int(p) for p in parts)
    out = Path(args.data_dir).expanduser() / f"{args.name}.npz"
    done = import_leaf(args.leaf, out, shape)
    kind = "images of " + "x".join(map(str, done.shape)) if done.images else f"feature vectors of {done.shape[0]}"
    print(f"{args.name}: {done.users:,} users, {done.samples:,} samples ({kind}), labels 0-{done.num_classes - 1}: "
          f"{done.path}")
    print(f"use with: --set data.dataset=file --set data.path={done.path} --set data.partition=natural")
    return 0
