"""A minimal in-tree PEP 517 build backend for this pure-Python package.

``pip install ./clients/python`` builds the package in an isolated
environment and first installs the backend that pyproject.toml names into
it. With setuptools that means fetching setuptools (and wheel) from an index,
which fails on a machine without PyPI. This backend needs nothing but the
standard library (pyproject.toml: ``requires = []``, ``backend-path``), so
the plain command works offline, and online the same. It builds:

- a wheel (``py3-none-any``) of the ``ticketing`` package, with the
  metadata of pyproject.toml's ``[project]`` table;
- an editable wheel (``pip install -e``): a ``.pth`` file naming this
  directory;
- an sdist of the package, pyproject.toml, README.md and this backend.

Only the fields this project's pyproject.toml uses are read, with a parser
for its simple ``key = "value"`` / ``key = [...]`` lines (tomllib is 3.11+,
and the package supports 3.9).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

__all__ = [
    "build_wheel",
    "build_editable",
    "build_sdist",
    "get_requires_for_build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "ticketing"


def _project() -> Dict[str, object]:
    """The ``[project]`` table of pyproject.toml (strings and string lists)."""
    out: Dict[str, object] = {}
    section = ""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = re.fullmatch(r"\[([^\]]+)\]", line)
            if m:
                section = m.group(1).strip()
                continue
            if section != "project":
                continue
            key, _, value = (s.strip() for s in line.partition("="))
            if value.startswith("["):
                out[key] = re.findall(r'"((?:[^"\\]|\\.)*)"', value)
            elif value.startswith('"'):
                out[key] = value[1:-1]
    return out


def _dist_name(p: Dict[str, object]) -> Tuple[str, str]:
    return re.sub(r"[-_.]+", "_", str(p["name"])), str(p["version"])


def _metadata(p: Dict[str, object]) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
    ]
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    for c in p.get("classifiers", []) or []:  # type: ignore[union-attr]
        lines.append(f"Classifier: {c}")
    for d in p.get("dependencies", []) or []:  # type: ignore[union-attr]
        lines.append(f"Requires-Dist: {d}")
    readme = str(p.get("readme", ""))
    body = ""
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _package_files() -> List[str]:
    """The package's files, relative to ROOT, sorted (no caches)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, PACKAGE)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".typed")):
                files.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return files


class _Wheel:
    """A wheel being written: every file goes into RECORD."""

    def __init__(self, path: str) -> None:
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.record: List[str] = []

    def add(self, arcname: str, data: bytes) -> None:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.zip.writestr(zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0)), data)
        self.record.append(f"{arcname},sha256={digest},{len(data)}")

    def close(self, dist_info: str) -> None:
        record = f"{dist_info}/RECORD"
        self.record.append(f"{record},,")
        self.zip.writestr(zipfile.ZipInfo(record, date_time=(1980, 1, 1, 0, 0, 0)), "\n".join(self.record) + "\n")
        self.zip.close()


def _build(wheel_directory: str, editable: bool) -> str:
    p = _project()
    name, version = _dist_name(p)
    filename = f"{name}-{version}-py3-none-any.whl"
    dist_info = f"{name}-{version}.dist-info"
    w = _Wheel(os.path.join(wheel_directory, filename))
    try:
        if editable:
            w.add(f"__editable__.{name}.pth", (ROOT + "\n").encode())
        else:
            for rel in _package_files():
                with open(os.path.join(ROOT, rel), "rb") as f:
                    w.add(rel.replace(os.sep, "/"), f.read())
        w.add(f"{dist_info}/METADATA", _metadata(p).encode())
        w.add(
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: ticketing_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        w.add(f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode())
    finally:
        w.close(dist_info)
    return filename


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    return _build(wheel_directory, editable=False)


def build_editable(
    wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None
) -> str:
    return _build(wheel_directory, editable=True)


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    p = _project()
    name, version = _dist_name(p)
    base = f"{name}-{version}"
    filename = f"{base}.tar.gz"
    files = _package_files() + ["pyproject.toml", str(p.get("readme") or "README.md"), os.path.join("_build", "ticketing_build.py")]
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            tar.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}", recursive=False)
        info = _metadata(p).encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(info)
        tar.addfile(ti, io.BytesIO(info))
    return filename
