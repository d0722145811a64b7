"""Where the project reads and writes its files: a local path or a URI, through pyarrow's filesystems.

Trajectory recording (``record_rollouts``), offline input, prompt datasets, ``rllib-p3o validate``, ``export_hf`` and
``rllib-p3o export`` (checkpoint and output) take either a local path or a URI that ``pyarrow.fs.FileSystem.from_uri`` opens (``s3://``, ``gs://``,
``hdfs://``, ``abfs://``, ``file://``), as Ray Data and Tune resolve theirs. An S3-compatible store (MinIO, Ceph,
...) is named in the URI the way pyarrow and Ray read it::

    s3://bucket/prefix?endpoint_override=http://10.0.0.5:9000&region=us-east-1

with credentials from the usual AWS environment variables or files. A URI pyarrow cannot open fails with a
`StorageError` naming it, never as a local folder called ``s3:``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, List, Optional, Union
from urllib.parse import urlparse

# The schemes `pyarrow.fs.FileSystem.from_uri` opens (pyarrow >= 15).
PYARROW_SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")

PathLike = Union[str, os.PathLike]


class StorageError(ValueError):
    """A path or URI that cannot be opened (unknown scheme, missing bucket, no credentials); the message names it."""


def uri_scheme(path: PathLike) -> str:
    """The URI scheme of ``path`` (``"s3"``), or ``""`` for a plain local path."""
    scheme = urlparse(os.fspath(path)).scheme
    return scheme.lower() if len(scheme) > 1 else ""  # one letter: a Windows drive


def is_uri(path: PathLike) -> bool:
    return bool(uri_scheme(path))


def check_uri(path: PathLike, what: str) -> None:
    """Raise `StorageError` if ``path`` is a URI whose scheme pyarrow has no filesystem for (no network access:
    for config validation)."""
    scheme = uri_scheme(path)
    if scheme and scheme not in PYARROW_SCHEMES:
        raise StorageError(
            f"{what}={os.fspath(path)!r}: pyarrow has no filesystem for '{scheme}://' URIs; give a local path or a "
            f"URI with one of the schemes {', '.join(s + '://' for s in PYARROW_SCHEMES)}"
        )


@dataclasses.dataclass(frozen=True)
class Location:
    """A file or directory on a pyarrow filesystem: the filesystem, the path in its terms and, for a URI, the scheme
    and the options of the URI it came from (so `child` locations print and re-open as URIs)."""

    filesystem: Any  # pyarrow.fs.FileSystem
    path: str
    scheme: str = ""
    query: str = ""

    @property
    def is_local(self) -> bool:
        import pyarrow.fs

        return isinstance(self.filesystem, pyarrow.fs.LocalFileSystem)

    @property
    def uri(self) -> str:
        """The path or URI that `locate` opens again at this location (options included)."""
        if not self.scheme:
            return self.path
        return f"{self.scheme}://{self.path}" + (f"?{self.query}" if self.query else "")

    def __str__(self) -> str:  # for messages: without the URI's options (endpoints, regions)
        return f"{self.scheme}://{self.path}" if self.scheme else self.path

    def child(self, *names: str) -> "Location":
        return dataclasses.replace(self, path="/".join([self.path.rstrip("/"), *names]))

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def _type(self):
        try:
            return self.filesystem.get_file_info(self.path).type
        except OSError as e:
            raise StorageError(f"{self}: {e}") from e

    def exists(self) -> bool:
        import pyarrow.fs

        return self._type() != pyarrow.fs.FileType.NotFound

    def is_dir(self) -> bool:
        import pyarrow.fs

        return self._type() == pyarrow.fs.FileType.Directory

    def makedirs(self) -> None:
        try:
            self.filesystem.create_dir(self.path, recursive=True)
        except OSError as e:
            raise StorageError(f"cannot create directory {self}: {e}") from e

    def list_files(self, suffix: str = "", recursive: bool = False) -> List["Location"]:
        """Files under this directory whose names end with ``suffix``, sorted; hidden names (``.``/``_``, as Ray Data
        and pyarrow datasets skip them) are left out."""
        import pyarrow.fs

        try:
            infos = self.filesystem.get_file_info(pyarrow.fs.FileSelector(self.path, recursive=recursive))
        except OSError as e:
            raise StorageError(f"cannot list {self}: {e}") from e
        base = self.path.rstrip("/")
        out = []
        for info in infos:
            relative = info.path[len(base) :].lstrip("/") if info.path.startswith(base) else info.base_name
            hidden = any(part.startswith((".", "_")) for part in relative.split("/"))
            if info.type == pyarrow.fs.FileType.File and info.base_name.endswith(suffix) and not hidden:
                out.append(dataclasses.replace(self, path=info.path))
        return sorted(out, key=lambda loc: loc.path)

    def has_entries(self) -> bool:
        """Whether this directory holds anything, hidden files and empty subdirectories included."""
        import pyarrow.fs

        return bool(self.filesystem.get_file_info(pyarrow.fs.FileSelector(self.path, allow_not_found=True)))

    def read_bytes(self) -> bytes:
        with self.filesystem.open_input_stream(self.path) as f:
            return f.read()

    def delete(self) -> None:
        self.filesystem.delete_file(self.path)

    def write_atomically(self, write: Callable[["Location"], None]) -> "Location":
        """Call ``write(tmp)`` on a hidden temporary file beside this one, then move it here: readers see the whole
        file or none. Local files are flushed to disk (fsync) before the move; on an object store the upload
        becomes visible only once complete."""
        tmp = dataclasses.replace(self, path=self.path.rsplit("/", 1)[0] + f"/.{self.name}.tmp")
        write(tmp)
        if self.is_local:
            with open(tmp.path, "rb") as f:
                os.fsync(f.fileno())
        self.filesystem.move(tmp.path, self.path)
        return self


def locate(path: PathLike, filesystem: Optional[Any] = None) -> Location:
    """The `Location` of a local path or a URI, through ``pyarrow.fs.FileSystem.from_uri`` (or on ``filesystem``,
    e.g. RLlib's ``input_filesystem``, with the URI's scheme and options stripped). Raises `StorageError` for a URI
    pyarrow cannot open."""
    import pyarrow.fs

    text = os.fspath(path)
    scheme = uri_scheme(text)
    parsed = urlparse(text)
    if filesystem is not None:
        fs_path = (parsed.netloc + parsed.path) if scheme and scheme != "file" else (parsed.path or text)
        return Location(filesystem, fs_path, scheme if scheme != "file" else "", parsed.query if scheme else "")
    if not scheme or scheme == "file":
        local = parsed.path if scheme == "file" else text
        return Location(pyarrow.fs.LocalFileSystem(), os.path.abspath(os.path.expanduser(local)))
    check_uri(text, "path")
    try:
        fs, fs_path = pyarrow.fs.FileSystem.from_uri(text)
    except (ValueError, OSError, ImportError) as e:
        raise StorageError(f"{text}: pyarrow cannot open this URI: {e}") from e
    return Location(fs, fs_path, scheme, parsed.query)


def upload_dir(local_dir: str, target: Location) -> None:
    """Copy the files of ``local_dir`` (recursively) to ``target`` (`pyarrow.fs.copy_files`)."""
    import pyarrow.fs

    target.makedirs()
    try:
        pyarrow.fs.copy_files(
            local_dir,
            target.path,
            source_filesystem=pyarrow.fs.LocalFileSystem(),
            destination_filesystem=target.filesystem,
        )
    except OSError as e:
        raise StorageError(f"cannot copy {local_dir} to {target}: {e}") from e


def download_dir(source: Location, local_dir: str) -> None:
    """Copy the files under ``source`` (recursively, hidden names left out as in `Location.list_files`) into
    ``local_dir``, streamed."""
    import shutil

    base = source.path.rstrip("/")
    for remote in source.list_files(recursive=True):
        local = os.path.join(local_dir, *remote.path[len(base) + 1 :].split("/"))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        try:
            with remote.filesystem.open_input_stream(remote.path) as f, open(local, "wb") as dst:
                shutil.copyfileobj(f, dst, 2**24)
        except OSError as e:
            raise StorageError(f"cannot copy {remote} to {local}: {e}") from e
