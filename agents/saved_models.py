"""Loading models saved by ``scripts/train.py`` (sb3-contrib MaskablePPO ``.zip`` files)."""

from __future__ import annotations

import base64
import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

LEGACY_PACKAGES = ("agents", "envs")
"""Top-level names that models saved before the package moved under ``hexagent_gym`` record
their policy class under (``agents.learned.EquivariantPolicy``,
``agents.equivariant_policy.EquivariantPolicy``); they are now ``hexagent_gym.agents...``."""


class _RenamingUnpickler(pickle.Unpickler):
    """Unpickles, reading a legacy module ``agents.X`` as ``hexagent_gym.agents.X`` (and
    ``envs.X`` as ``hexagent_gym.envs.X``)."""

    renamed = False

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] in LEGACY_PACKAGES:
            module = f"hexagent_gym.{module}"
            self.renamed = True
        return super().find_class(module, name)


def legacy_objects(path: Path) -> dict[str, Any]:
    """The pickled entries of a zip's ``data`` that name a pre-``hexagent_gym`` module (its policy
    class ``agents.learned.EquivariantPolicy``, its action space ``envs.encoding.MaskedDiscrete``),
    each unpickled from its current home, for SB3's ``custom_objects``; empty for any other zip
    (and for an unreadable one, which SB3 then reports itself)."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
    except (KeyError, ValueError, zipfile.BadZipFile):
        return {}
    found = {}
    for key, value in data.items():
        if not isinstance(value, dict) or not isinstance(value.get(":serialized:"), str):
            continue
        try:
            raw = base64.b64decode(value[":serialized:"])
            renamed = _RenamingUnpickler(io.BytesIO(raw))
            obj = renamed.load()
        except Exception:  # noqa: BLE001 - left to SB3, which warns or raises in its own words
            continue
        if renamed.renamed:
            found[key] = obj
    return found


def load_saved_model(path: str | Path) -> Any:
    """Load a MaskablePPO model saved by ``scripts/train.py`` or ``model.save()`` (on the CPU).

    Its policy class is unpickled by reference
    (``hexagent_gym.agents.equivariant_policy.EquivariantPolicy`` for equivariant models saved
    now). Older zips name it ``agents.learned.EquivariantPolicy`` or
    ``agents.equivariant_policy.EquivariantPolicy``, from before the package installed under
    ``hexagent_gym`` (and their action space ``envs.encoding.MaskedDiscrete``): those are
    resolved to the current modules (:func:`legacy_objects`).

    Raises:
        FileNotFoundError: nothing at ``path`` (with or without ``.zip``).
        ValueError: the file is not a MaskablePPO model.
    """
    path = Path(path)
    if not path.is_file() and not path.with_suffix(".zip").is_file():
        raise FileNotFoundError(f"no saved model at {path}: pass a .zip written by "
                                "scripts/train.py (--out) or model.save(), or a policy name")
    from sb3_contrib import MaskablePPO  # only runs that load models pay for the import

    zip_path = path if path.is_file() else path.with_suffix(".zip")
    try:
        return MaskablePPO.load(path, device="cpu", custom_objects=legacy_objects(zip_path))
    except (KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a MaskablePPO model saved by stable-baselines3 "
                         f"({type(exc).__name__}: {exc})") from exc
