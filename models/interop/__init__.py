"""Public checkpoints as instrumented models: `from_pretrained(source)` converts a transformers /
fla model (in memory, or a local checkpoint directory) into our SequenceModel, one converter per
architecture (registry.CONVERTERS)."""

from models.interop.convert import UnsupportedConfig
from models.interop.load import from_pretrained
from models.interop.registry import supported_architectures

__all__ = ["UnsupportedConfig", "from_pretrained", "supported_architectures"]
