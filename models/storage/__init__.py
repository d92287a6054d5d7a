"""What reaches the disk and how: `paths` (paths inside a run directory, no link followed, the
directory lock), `writer` (the one atomic writer of every output file), `saving` (a model's
config and safetensors weights, save / load)."""
