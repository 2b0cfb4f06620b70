"""Ingest binds its chunk and roll-up columns as PostgreSQL arrays in binary form, built by
numpy (backend/store/pg_arrays.py): every value must reach PostgreSQL exactly as psycopg's own
list binding sends it, whatever its sign, size or bytes."""
from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest

from paritywatch.backend.store.pg_arrays import ByteaArray, bind_column

pytestmark = pytest.mark.postgres

INTS = [0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)]
FLOATS = [0.0, -0.0, 1.5, -2.25e-308, 5e-324, 1.7976931348623157e308, math.inf, -math.inf, 0.1 + 0.2]
BLOBS = [b"", b"\x00", bytes(range(256)), np.arange(5, dtype="<f8").tobytes()]


@pytest.fixture
def conn(postgresql_url):
    with psycopg.connect(postgresql_url.replace("postgresql+psycopg://", "postgresql://")) as c:
        yield c


def round_trip(conn, sql_type: str, param) -> list:
    return conn.execute(f"SELECT %s::{sql_type}[]", (param,)).fetchone()[0]


def test_numbers_flags_and_bytes_arrive_as_psycopg_sends_them(conn) -> None:
    assert round_trip(conn, "bigint", bind_column(np.array(INTS, dtype=np.int64))) == \
        round_trip(conn, "bigint", INTS) == INTS
    floats = round_trip(conn, "float8", bind_column(np.array(FLOATS, dtype=np.float64)))
    assert [f.hex() for f in floats] == [f.hex() for f in FLOATS]  # -0.0 and the last bit kept
    assert math.isnan(round_trip(conn, "float8", bind_column(np.array([math.nan])))[0])
    assert round_trip(conn, "boolean", bind_column(np.array([True, False, True]))) == [True, False, True]
    assert round_trip(conn, "bytea", ByteaArray(BLOBS)) == round_trip(conn, "bytea", BLOBS) == BLOBS


def test_empty_columns_and_narrower_casts(conn) -> None:
    assert round_trip(conn, "bigint", bind_column(np.array([], dtype=np.int64))) == []
    assert round_trip(conn, "bytea", ByteaArray([])) == []
    # The ingest statements cast int8 arrays to int[] where the column is an integer.
    assert round_trip(conn, "int", bind_column(np.array([7, -7, 2**31 - 1]))) == [7, -7, 2**31 - 1]
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        round_trip(conn, "int", bind_column(np.array([2**31])))
