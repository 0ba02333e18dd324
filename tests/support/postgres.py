"""The PostgreSQL server the tests run against (``DATABASE_URL``'s, or an embedded one: ``tests/conftest.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


@dataclass
class PgServer:
    admin_url: str
    bin_dir: str | None = None

    def url(self, database: str) -> str:
        params: dict[str, Any] = conninfo_to_dict(self.admin_url)
        params["dbname"] = database
        return make_conninfo(**params)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_url, autocommit=True)
