"""A warehouse on S3-compatible object storage: the tables' data and metadata files under
`s3://bucket/prefix` (`runledger ledger serve --warehouse s3://bucket/prefix`), the catalog, the locks and
the rest of the root on local disk.

The root names its warehouse in `warehouse.json` (`{"warehouse", "endpoint", "region"}`, no secret),
so every reader of the root (the views, `verify`, `replay`) reads the snapshot's files from the bucket;
the catalog's metadata locations are `s3://` URIs, which `paths` turns into `ObjectPath`s. Credentials
come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), else from the root's
`s3.credentials` (mode 0600, JSON: written by `use_warehouse` from the variables, or by hand, or copied
from `--s3-credentials FILE`): never logged, never put into a child's environment, so the processes the
root starts read them from that file. The endpoint is AWS_ENDPOINT_URL, else the one recorded.

An object is written whole by one PUT, so a reader never sees half of one (what `files.write_atomic`
gets on disk from a temp file and a rename); S3 has no rename, and nothing here needs one.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

WAREHOUSE_FILE = "warehouse.json"
CREDENTIALS_FILE = "s3.credentials"
SCHEME = "s3://"
ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION",
            "AWS_DEFAULT_REGION")

_LOCK = threading.Lock()
_CONFIG: dict = {}  # endpoint, region, access_key, secret_key, session_token (this process's warehouse)
_FS: dict = {}  # frozen config -> pyarrow S3FileSystem


def is_object(p) -> bool:
    return isinstance(p, ObjectPath) or (isinstance(p, str) and p.startswith(SCHEME))


def parse(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; ValueError (one line) for anything else."""
    if not uri.startswith(SCHEME) or not uri[len(SCHEME):].split("/")[0]:
        raise ValueError(f"a warehouse on object storage is given as s3://bucket/prefix, not {uri!r}")
    bucket, _, prefix = uri[len(SCHEME):].partition("/")
    return bucket, prefix.strip("/")


def _from_env() -> dict:
    env = os.environ
    out = {"endpoint": env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3"),
           "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")}
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        out.update(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                   session_token=env.get("AWS_SESSION_TOKEN"))
    return {k: v for k, v in out.items() if v}


def read_credentials(path: Path) -> dict:
    """access_key/secret_key (session_token) from a credentials file: JSON with those keys (or AWS's
    names), or the `aws_access_key_id = ...` lines of an AWS credentials file; refused (ValueError,
    one line, no secret in it) if others than its owner may read it."""
    path = Path(path)
    if os.stat(path).st_mode & 0o077:
        raise ValueError(f"{path}: credentials must be readable by their owner alone (chmod 600)")
    text = path.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
        for line in text.splitlines():
            key, eq, value = line.partition("=")
            if eq:
                data[key.strip().lower()] = value.strip()
    names = {"access_key": ("access_key", "aws_access_key_id", "AWS_ACCESS_KEY_ID"),
             "secret_key": ("secret_key", "aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
             "session_token": ("session_token", "aws_session_token", "AWS_SESSION_TOKEN")}
    out = {k: next((data[n] for n in ns if data.get(n)), None) for k, ns in names.items()}
    if not (out["access_key"] and out["secret_key"]):
        raise ValueError(f"{path} holds no access key and secret key")
    return {k: v for k, v in out.items() if v}


def warehouse_of(root: Path) -> dict | None:
    """The root's warehouse.json ({"warehouse", "endpoint", "region"}), or None (tables under the root)."""
    try:
        return json.loads((Path(root) / WAREHOUSE_FILE).read_text())
    except (OSError, ValueError):
        return None


def configure(root: Path) -> dict | None:
    """Make this process read and write the root's warehouse (if it has one): endpoint and region from
    the environment or warehouse.json, credentials from the environment or the root's s3.credentials."""
    named = warehouse_of(root)
    if named is None:
        return None
    config = {"endpoint": named.get("endpoint"), "region": named.get("region")}
    config = {k: v for k, v in config.items() if v}
    config.update(_from_env())
    if "access_key" not in config and (Path(root) / CREDENTIALS_FILE).exists():
        config.update(read_credentials(Path(root) / CREDENTIALS_FILE))
    with _LOCK:
        _CONFIG.clear()
        _CONFIG.update(config)
    return named


def configure_env() -> None:
    """Make this process read object storage with the environment's endpoint, region and credentials alone
    (a reader given an s3:// URI and no root that names its warehouse: `runledger tlog audit --log`)."""
    with _LOCK:
        _CONFIG.clear()
        _CONFIG.update(_from_env())


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, readable by this user only (0600) from the moment it exists."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # (a leftover may have another mode: O_EXCL makes a new file)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def use_warehouse(root: Path, warehouse: str, credentials: Path | None = None) -> None:
    """Name `warehouse` (s3://bucket/prefix) in the root for its writer and readers, with the endpoint and
    region of the environment, and keep the credentials (of `credentials`, else the AWS variables) in the
    root's s3.credentials (0600) for the processes the root starts. A root keeps the warehouse its
    tables were made in: another one is refused (ValueError, one line)."""
    parse(warehouse)
    root = Path(root)
    current = warehouse_of(root)
    if current is not None and current.get("warehouse") != warehouse.rstrip("/"):
        raise ValueError(f"{root} keeps its tables in {current.get('warehouse')}, not {warehouse}")
    if current is None and (root / "tables.json").exists():  # (paths.MARKER: its tables are made, under the root)
        raise ValueError(f"{root} keeps its tables under the root, not in {warehouse} (moving them is not done)")
    env = _from_env()
    creds = read_credentials(credentials) if credentials else {k: env[k] for k in ("access_key", "secret_key",
                                                                                   "session_token") if k in env}
    root.mkdir(parents=True, exist_ok=True)
    if creds:
        _write_private(root / CREDENTIALS_FILE, json.dumps(creds))
    record = {"warehouse": warehouse.rstrip("/"), "endpoint": env.get("endpoint"), "region": env.get("region")}
    if current != record:
        tmp = root / f".{WAREHOUSE_FILE}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, root / WAREHOUSE_FILE)
    configure(root)


def filesystem():
    """pyarrow's S3 file system for this process's warehouse (`configure`)."""
    from pyarrow import fs

    with _LOCK:
        key = tuple(sorted(_CONFIG.items()))
        got = _FS.get(key)
        if got is None:
            endpoint = _CONFIG.get("endpoint")
            kw = {}
            if endpoint:
                scheme, _, host = endpoint.partition("://")
                kw.update(endpoint_override=host.rstrip("/") if host else endpoint, scheme=scheme if host else "https")
            got = _FS[key] = fs.S3FileSystem(
                access_key=_CONFIG.get("access_key"), secret_key=_CONFIG.get("secret_key"),
                session_token=_CONFIG.get("session_token"), region=_CONFIG.get("region") or "us-east-1",
                connect_timeout=5, request_timeout=30, retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=5),
                **kw)
        return got


def iceberg_properties() -> dict[str, str]:
    """pyiceberg's FileIO properties for this process's warehouse (its S3 file system, pyarrow's)."""
    with _LOCK:
        c = dict(_CONFIG)
    props = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO", "s3.region": c.get("region") or "us-east-1"}
    if c.get("endpoint"):
        props["s3.endpoint"] = c["endpoint"]
    if c.get("access_key"):
        props.update({"s3.access-key-id": c["access_key"], "s3.secret-access-key": c["secret_key"]})
    if c.get("session_token"):
        props["s3.session-token"] = c["session_token"]
    return props


class ObjectPath:
    """An object's `s3://bucket/key`, with what the ledger does to a file's pathlib.Path (read, write
    whole, delete, list, name, parent, join)."""

    __slots__ = ("uri",)

    def __init__(self, uri: str) -> None:
        if not uri.startswith(SCHEME):
            raise ValueError(f"not an object URI: {uri!r}")
        self.uri = uri.rstrip("/")

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"ObjectPath({self.uri!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectPath) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __lt__(self, other) -> bool:
        return str(self) < str(other)

    def __truediv__(self, part) -> "ObjectPath":
        return ObjectPath(f"{self.uri}/{str(part).strip('/')}")

    @property
    def key(self) -> str:
        """bucket/key: the path pyarrow's S3 file system takes."""
        return self.uri[len(SCHEME):]

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "ObjectPath":
        return ObjectPath(self.uri.rsplit("/", 1)[0])

    def with_name(self, name: str) -> "ObjectPath":
        return self.parent / name

    def resolve(self) -> "ObjectPath":
        return self

    def exists(self) -> bool:
        from pyarrow import fs

        return filesystem().get_file_info(self.key).type != fs.FileType.NotFound

    def is_file(self) -> bool:
        """Whether the object is there (a snapshot's file, whose size its manifest gave, is taken to be)."""
        return self.key in _SIZES or self.exists()

    @property
    def parents(self) -> list["ObjectPath"]:
        out, p = [], self
        while p.key.count("/"):
            p = p.parent
            out.append(p)
        return out

    def relative_to(self, other) -> Path:
        return Path(self.uri[len(str(other)):].lstrip("/"))

    def stat(self) -> SimpleNamespace:
        """Its size, from its manifest where known (a table's file: never rewritten, so a fixed time), else
        its size and time from the server (a chain heads file is replaced as the chain grows)."""
        from pyarrow import fs

        if self.key in _SIZES:
            return SimpleNamespace(st_size=_SIZES[self.key], st_mtime_ns=0)
        info = filesystem().get_file_info(self.key)
        if info.type == fs.FileType.NotFound:
            raise FileNotFoundError(self.uri)
        return SimpleNamespace(st_size=info.size, st_mtime_ns=info.mtime_ns or 0)

    def open(self, mode: str = "rb"):
        if mode == "rb":
            return filesystem().open_input_file(self.key)
        if mode == "wb":
            return filesystem().open_output_stream(self.key)
        raise ValueError(f"an object opens as rb or wb, not {mode}")

    def read_bytes(self) -> bytes:
        try:
            with filesystem().open_input_stream(self.key) as f:
                return f.read()
        except OSError as err:
            if "NoSuchKey" in str(err) or "does not exist" in str(err) or "Not Found" in str(err):
                raise FileNotFoundError(self.uri) from err
            raise

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        with filesystem().open_output_stream(self.key) as f:
            f.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            filesystem().delete_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise
        except OSError as err:
            if not (missing_ok and ("NoSuchKey" in str(err) or "does not exist" in str(err))):
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """(nothing: an object store has no folders)"""

    def files(self, suffix: str = ".parquet") -> list["ObjectPath"]:
        """Every object under this prefix whose name ends with `suffix`."""
        from pyarrow import fs

        infos = filesystem().get_file_info(fs.FileSelector(self.key, recursive=True, allow_not_found=True))
        return sorted(ObjectPath(SCHEME + i.path) for i in infos
                      if i.type == fs.FileType.File and i.path.endswith(suffix))


def as_path(location: str | Path) -> "Path | ObjectPath":
    """A file's location as the ledger handles it: an ObjectPath for s3://, else a local Path."""
    if isinstance(location, ObjectPath):
        return location
    text = str(location)
    return ObjectPath(text) if text.startswith(SCHEME) else Path(text.removeprefix("file://"))


def source(p):
    """What pyarrow.parquet reads `p` from: a local path as it is, an object as an open file of it."""
    if isinstance(p, str) and p.startswith(SCHEME):
        p = ObjectPath(p)
    return p.open("rb") if isinstance(p, ObjectPath) else p


def exists(p) -> bool:
    """Whether a snapshot's file is there. An object is taken to be (a HEAD per file would make every
    read list the bucket): `paths.missing_files`, which `verify` runs, checks each."""
    return True if is_object(p) else os.path.exists(p)


_SIZES: dict[str, int] = {}  # bucket/key -> its size, from the manifests (an object is never rewritten)


def remember_size(uri: str, size: int) -> None:
    _SIZES[uri.removeprefix(SCHEME)] = size
    while len(_SIZES) > 1_000_000:
        _SIZES.pop(next(iter(_SIZES)))


class PositionalFile:
    """An object opened for DuckDB, read at a position per thread.

    DuckDB's Python file system reads "n bytes at offset x" as `seek(x)` then `read(n)` on one file object
    that its threads share (a Parquet file's row groups are scanned by several), and copies whatever comes
    back without checking its length. pyarrow's file keeps one position and lets go of the GIL inside
    `read`, so another thread's `seek` could land between the two: the read then returned the bytes of
    another range, and DuckDB failed with "Out of buffer" or "Snappy decompression failure" now and then
    (only under load, where a thread is descheduled in that gap). Here each thread has its own position
    (keyed by the OS thread: DuckDB's threads get a new Python thread state for each call) and every read
    is pyarrow's positional `read_at`, which is safe across threads; a read that comes back short is
    completed by asking for the rest (DuckDB would take the short bytes for all it asked for)."""

    def __init__(self, path: str, f, size: int) -> None:
        self._path = path
        self._f = f
        self._size = size
        self._at: dict[int, int] = {}  # thread ident -> its position

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._at.get(threading.get_ident(), 0)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.tell(), 2: self._size}[whence]
        self._at[threading.get_ident()] = base + offset
        return base + offset

    def read(self, n: int = -1) -> bytes:
        at = self.tell()
        n = max(0, self._size - at if n is None or n < 0 else min(n, self._size - at))
        parts, got = [], 0
        while got < n:  # (a response cut short is asked again for the rest, never passed on short)
            part = self._f.read_at(n - got, at + got)
            if not part:
                raise OSError(f"{self._path}: {n - got} bytes at {at + got} did not come")
            parts.append(part)
            got += len(part)
        self._at[threading.get_ident()] = at + n
        return b"".join(parts)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "PositionalFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def register_duckdb(con) -> None:
    """Let DuckDB connection `con` read `s3://` through pyarrow's S3 file system (DuckDB's own, the
    `httpfs` extension, is downloaded on first use: not here, offline): see duckdb_filesystem."""
    if "s3" not in con.list_filesystems():
        con.register_filesystem(duckdb_filesystem())


def duckdb_filesystem():
    """The fsspec file system DuckDB reads `s3://` through: pyarrow's S3 file system for this process's
    warehouse, in fsspec's ArrowFSWrapper. A snapshot's file has the size its manifest gives and a fixed
    time (it never changes): DuckDB's look at it costs no request (its opening, pyarrow's, still HEADs it
    once). Each file opens as a PositionalFile: see there why."""
    from datetime import datetime, timezone

    from fsspec.implementations.arrow import ArrowFSWrapper

    written = datetime(1970, 1, 1, tzinfo=timezone.utc)

    class S3(ArrowFSWrapper):
        protocol = "s3"

        def info(self, path, **kwargs):
            key = self._strip_protocol(path)
            size = _SIZES.get(key)
            if size is None:
                return super().info(path, **kwargs)
            return {"name": key, "size": size, "type": "file", "mtime": written}

        def modified(self, path):
            return written if self._strip_protocol(path) in _SIZES else super().modified(path)

        def _open(self, path, mode="rb", block_size=None, seekable=True, **kwargs):
            if mode != "rb":
                return super()._open(path, mode, block_size, seekable, **kwargs)
            key = self._strip_protocol(path)
            f = self.fs.open_input_file(key)
            return PositionalFile(key, f, f.size())

    return S3(filesystem())
