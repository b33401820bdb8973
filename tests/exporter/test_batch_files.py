"""The Parquet batches the warehouse writes read back in DuckDB as they were written."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from exporter import duck
from exporter.sinks.batch_files import Encoded, write_parquet

TYPES = {"n": "DOUBLE", "i": "BIGINT", "s": "VARCHAR", "few": "VARCHAR"}


@pytest.mark.parametrize(("rows", "nulls"), [(0, 0.0), (1, 0.0), (9, 0.0), (8000, 0.0),
                                             (8000, 0.3), (17, 1.0)])
def test_a_batch_reads_back_as_written(tmp_path: Path, rows: int, nulls: float) -> None:
    """Numbers with and without NULLs, distinct strings and repeated ones (a dictionary),
    each column as its values were."""
    rng = random.Random(rows)

    def maybe(value: object) -> object:
        return None if rng.random() < nulls else value

    columns = {
        "n": [maybe(rng.choice([0.0, -1.5, 1e300, math.pi, rng.random()])) for _ in range(rows)],
        "i": [maybe(rng.randrange(-2**62, 2**62)) for _ in range(rows)],
        "s": [maybe(f"GPU-{rng.getrandbits(64):016x}-é") for _ in range(rows)],
        "few": [maybe(rng.choice(["a", "b", "ñ"])) for _ in range(rows)],
    }
    path = tmp_path / "batch.parquet"
    write_parquet(str(path), columns, TYPES)
    con = duck.connect(":memory:")
    got = con.execute(f"SELECT n, i, s, few FROM read_parquet({duck.quote(str(path))})"
                      ).fetchall()
    assert got == list(zip(*columns.values(), strict=True))


def test_string_columns_kept_from_the_last_batch_read_back_as_written(tmp_path: Path) -> None:
    """A batch whose string columns repeat the last batch's reuses their pages; one that
    changes a value, adds a NULL or a row is encoded again: each file reads back as it was
    written."""
    few = ["a", "b", "a", "ñ"] * 50
    distinct = [f"GPU-{i}" for i in range(200)]
    batches = [
        {"n": [1.0] * 200, "i": [1] * 200, "s": distinct, "few": few},
        {"n": [2.0] * 200, "i": [2] * 200, "s": list(distinct), "few": list(few)},  # same
        {"n": [3.0] * 200, "i": [3] * 200, "s": [*distinct[:-1], "x"], "few": few},  # one new
        {"n": [4.0] * 200, "i": [4] * 200, "s": [None, *distinct[1:]], "few": few},  # a NULL
        {"n": [5.0] * 201, "i": [5] * 201, "s": [*distinct, "y"], "few": [*few, "b"]},  # a row
    ]
    kept: Encoded = {}
    con = duck.connect(":memory:")
    for k, columns in enumerate(batches):
        path = tmp_path / f"batch-{k}.parquet"
        write_parquet(str(path), columns, TYPES, kept)
        got = con.execute(f"SELECT n, i, s, few FROM read_parquet({duck.quote(str(path))})"
                          ).fetchall()
        assert got == list(zip(*columns.values(), strict=True))
    assert kept["s"].values == batches[-1]["s"]
