"""Loading models saved by ``scripts/train.py`` (sb3-contrib MaskablePPO ``.zip`` files)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any


def load_saved_model(path: str | Path) -> Any:
    """Load a MaskablePPO model saved by ``scripts/train.py`` or ``model.save()`` (on the CPU).

    Its policy class is unpickled by reference (``agents.equivariant_policy.EquivariantPolicy``
    for equivariant models saved now, ``agents.learned.EquivariantPolicy`` — a re-export — for
    older ones), so loading needs no ``custom_objects``.

    Raises:
        FileNotFoundError: nothing at ``path`` (with or without ``.zip``).
        ValueError: the file is not a MaskablePPO model.
    """
    path = Path(path)
    if not path.is_file() and not path.with_suffix(".zip").is_file():
        raise FileNotFoundError(f"no saved model at {path}: pass a .zip written by "
                                "scripts/train.py (--out) or model.save(), or a policy name")
    from sb3_contrib import MaskablePPO  # only runs that load models pay for the import

    try:
        return MaskablePPO.load(path, device="cpu")
    except (KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a MaskablePPO model saved by stable-baselines3 "
                         f"({type(exc).__name__}: {exc})") from exc
