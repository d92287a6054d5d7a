"""The trivial unit of benchmarks/scale_out.py's overhead section (a module of its own so that
spawned processes and Ray actors import it by name)."""


def one_row(model, inputs, spec):
    """One row of inputs["x"] through the model: next to nothing, so the time is the engine's."""
    row = spec["row"]
    return {"y": model(inputs["x"][row : row + 1])}
