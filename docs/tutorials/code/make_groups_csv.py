"""Write a CSV of feature vectors whose users fall into true groups, each group with its own label rule.

Every user's samples are standard normal feature vectors (``f0`` ... ``f3``); the label is which side of a
line through the origin the first two features fall on. The groups differ only in that line: group ``g``
turns it by ``g * 120`` degrees. The same features get different labels in different groups, so one
model for everybody cannot fit them all and a clustered method has the groups to find.

Columns: ``f0..f3`` (features), ``label`` (0/1), ``user`` (the device column, names such as ``user07``)
and ``group`` (the true group, 0..groups-1, which lcfed scores the clustering against).

    python make_groups_csv.py ~/.cache/lcfed/groups.csv     # data.data_dir's default
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

FEATURES = 4


def make_rows(users: int = 12, groups: int = 3, samples: int = 80, seed: int = 0) -> list[dict[str, object]]:
    """The table's rows: ``samples`` per user; user ``u`` is in group ``u % groups``."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for u in range(users):
        g = u % groups
        angle = 2 * np.pi * g / groups  # the group's decision line, turned
        x = rng.standard_normal((samples, FEATURES))
        y = (x[:, 0] * np.cos(angle) + x[:, 1] * np.sin(angle) > 0).astype(int)
        for xi, yi in zip(x, y, strict=True):
            rows.append({**{f"f{j}": round(float(v), 4) for j, v in enumerate(xi)},
                         "label": int(yi), "user": f"user{u:02d}", "group": g})
    return rows


def write_csv(path: Path, users: int = 12, groups: int = 3, samples: int = 80, seed: int = 0) -> Path:
    """Write the table to ``path`` (its folder is made if missing) and return the path."""
    rows = make_rows(users, groups, samples, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the CSV file to write")
    parser.add_argument("--users", type=int, default=12)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--samples", type=int, default=80, help="samples per user")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = write_csv(args.out.expanduser(), args.users, args.groups, args.samples, args.seed)
    print(f"wrote {args.users * args.samples} samples of {args.users} users in {args.groups} groups to {path}")


if __name__ == "__main__":
    main()
