"""The Parquet batches the warehouse writes read back in DuckDB as they were written."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from exporter import duck
from exporter.sinks.batch_files import write_parquet

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
