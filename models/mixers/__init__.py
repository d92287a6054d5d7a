"""Sequence mixers, one file each; importing this package registers all of them."""

import importlib
import pkgutil

from models.mixers.base import MIXERS, PRESETS, Mixer, RecurrentMixer, register_mixer

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["MIXERS", "PRESETS", "Mixer", "RecurrentMixer", "register_mixer"]
