"""``pip install ./clients/python`` works without an index: the in-tree
build backend (_build/ticketing_build.py) needs nothing but the standard
library, so pip's isolated build environment fetches nothing. Run in a fresh
venv with ``--no-index`` (no network used), for a wheel and an editable
install."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class InstallTest(unittest.TestCase):
    def venv(self, d: str) -> Path:
        subprocess.run([sys.executable, "-m", "venv", os.path.join(d, "venv")], check=True)
        return Path(d) / "venv" / "bin" / "python"

    def pip_install(self, py: Path, *args: str) -> None:
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        r = subprocess.run(
            [str(py), "-m", "pip", "install", "--no-index", *args], capture_output=True, text=True, env=env
        )
        self.assertEqual(r.returncode, 0, f"pip install {' '.join(args)}:\n{r.stdout}\n{r.stderr}")

    def imported_from(self, py: Path, cwd: str) -> str:
        r = subprocess.run(
            [str(py), "-c", "import ticketing, ticketing.fence; print(ticketing.__file__, ticketing.__version__)"],
            capture_output=True, text=True, cwd=cwd, check=True,
        )
        return r.stdout

    def test_pip_install_without_an_index(self) -> None:
        with tempfile.TemporaryDirectory(prefix="tk-pip-") as d:
            py = self.venv(d)
            self.pip_install(py, str(ROOT))
            out = self.imported_from(py, d)
            self.assertIn(os.path.join("site-packages", "ticketing", "__init__.py"), out)
            self.assertIn("0.1.0", out)
            # The installed copy has py.typed (PEP 561).
            site = out.split()[0].rsplit(os.sep, 1)[0]
            self.assertTrue(os.path.exists(os.path.join(site, "py.typed")))

    def test_editable_install_without_an_index(self) -> None:
        with tempfile.TemporaryDirectory(prefix="tk-pip-") as d:
            py = self.venv(d)
            self.pip_install(py, "-e", str(ROOT))
            self.assertIn(str(ROOT / "ticketing" / "__init__.py"), self.imported_from(py, d))
