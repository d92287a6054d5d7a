"""Training and run directories.

    train.py        the training loop: AdamW, warmup + cosine schedule, length curriculum, NaN stop,
                    checkpoints every k steps, bit-identical resume
    checkpoint.py   run directories: config.json, metrics.jsonl, checkpoints (weights, optimizer
                    and trainer state in a step directory, made visible by an atomic pointer switch)
    evaluate.py     accuracy by length, mp, the evaluation seed streams
    data.py         finite data sets: N distinct sequences, a disjoint validation set, mixed
                    lengths in equal shares, epochs

May import: interp.tasks, models, probes. Never interp.analysis, interp.report or interp.cli.
"""
