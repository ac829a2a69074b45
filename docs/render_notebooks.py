"""Execute every notebook in notebooks/ and write the figures it draws into docs/img/notebooks/.

The documentation shows these images on its analysis page, so a reader sees the figures
without running Jupyter. The images are committed: the site builds offline, without a
kernel. Run this after changing a notebook (or what it measures) and commit the result:

    python docs/render_notebooks.py

Figure ``k`` (1-based, in output order) of ``notebooks/<name>.ipynb`` becomes
``docs/img/notebooks/<name>-<k>.png``; images of an earlier run that the notebook no longer
draws are removed. Needs ``redcount[analysis]``, nbclient and ipykernel (the test extra).
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "notebooks"


def render(path: Path) -> list[Path]:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    written: list[Path] = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png is None:
                continue
            target = OUT / f"{path.stem}-{len(written) + 1}.png"
            target.write_bytes(base64.b64decode(png))
            written.append(target)
    for stale in OUT.glob(f"{path.stem}-*.png"):
        if stale not in written:
            stale.unlink()
    return written


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    notebooks = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for nb in notebooks:
        images = render(nb)
        print(f"{nb.name}: {len(images)} figure(s)", *(f"  {p.relative_to(ROOT)}" for p in images), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
