"""The last signed checkpoint of each transparency log as a row of a shared catalog (a PostgreSQL the
ledger hosts of a root share): the log's origin, size and root, moved only by compare-and-swap. Two
hosts of one log (a partition taken over, a writer that did not know it lost its lease) each check their
tree against the row before signing and move it from the row they read: the second to sign from the
same row loses and signs nothing, so the log never has two inconsistent checkpoints
(runledger.ledger.tlog.log keeps it in `{root}/tlog-state/` instead when the catalog is the root's own).
"""

from __future__ import annotations

TABLE = "runledger_tlog_signed"


class SignedRows:
    """The rows of a catalog's SQLAlchemy `engine` (the table made on first use)."""

    def __init__(self, engine) -> None:
        from sqlalchemy import BigInteger, Column, MetaData, String, Table

        self.engine = engine
        meta = MetaData()
        self.table = Table(TABLE, meta, Column("origin", String(512), primary_key=True),
                           Column("size", BigInteger, nullable=False), Column("root", String(64), nullable=False))
        try:
            meta.create_all(engine)
        except Exception:  # (another host made it at the same moment)
            meta.create_all(engine)

    def get(self, origin: str) -> dict | None:
        """{"size", "root"} of the last checkpoint signed for `origin`, or None. OSError when the catalog
        cannot be reached (the log then signs at a later commit or quiet moment)."""
        from sqlalchemy import select

        with _reached():
            with self.engine.connect() as c:
                row = c.execute(select(self.table.c.size, self.table.c.root)
                                .where(self.table.c.origin == origin)).first()
        return {"size": int(row[0]), "root": row[1]} if row else None

    def swap(self, origin: str, old: dict | None, new: dict) -> bool:
        """Move the row of `origin` from `old` (None: no row yet) to `new`; False if it was not `old`.
        OSError when the catalog cannot be reached (whether the row moved is then read again next time)."""
        from sqlalchemy import insert, update
        from sqlalchemy.exc import IntegrityError

        t = self.table
        if old is None:
            try:
                with _reached(), self.engine.begin() as c:
                    c.execute(insert(t).values(origin=origin, size=new["size"], root=new["root"]))
            except IntegrityError:  # (another host's first signature came first)
                return False
            return True
        with _reached(), self.engine.begin() as c:
            done = c.execute(update(t).where(t.c.origin == origin, t.c.size == old["size"], t.c.root == old["root"])
                             .values(size=new["size"], root=new["root"]))
            return done.rowcount == 1


class _reached:
    """A catalog's server that cannot be reached (down, restarting) as an OSError, one line."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> bool:
        from sqlalchemy.exc import IntegrityError, OperationalError

        if err is not None and isinstance(err, OperationalError) and not isinstance(err, IntegrityError):
            raise OSError(f"the catalog's row of the last signed checkpoint cannot be reached: "
                          f"{str(err).splitlines()[0][:200]}") from err
        return False


def of_tables(tables) -> SignedRows | None:
    """The rows of a root's tables' catalog (runledger.ledger.storage.tables.Tables) when it is shared
    (not the root's own sqlite), else None."""
    engine = getattr(getattr(tables, "catalog", None), "engine", None)
    if engine is None or engine.url.get_backend_name() == "sqlite":
        return None
    return SignedRows(engine)
