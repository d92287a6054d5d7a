"""Read-outs of representations. Takes arrays; never imports `interp` or `models`."""
