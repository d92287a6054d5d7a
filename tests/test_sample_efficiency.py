"""The N* search on fake trial functions with known answers, kappa arithmetic, the tidy rows, and
one real tiny trial."""

import math

import numpy as np
import pytest

from interp.analysis import sample_efficiency as se


def fake_runner(threshold, log=None):
    """converged iff n >= threshold(config); records every trial."""

    def run(trials):
        rows = []
        for trial in trials:
            if log is not None:
                log.append(trial)
            rows.append({**trial, "converged": trial["n"] >= threshold(trial), "val_loss": 1.0 / trial["n"]})
        return rows

    return run


def condition(length=3, **extra):
    return {"model": "lstm", "task": "Z5", "format": "acot", "length": length, "lengths": [length],
            "max_length": 4, "ood_lengths": [], **extra}


NO_CAP = dict(capacity=lambda c: None)


@pytest.mark.parametrize("n_true", [1, 2, 3, 16, 17, 100, 1000, 4097, 30000])
def test_exact_search_finds_the_threshold_in_log_trials(n_true):
    log = []
    configs = [{"lr": 1e-3, "seed": 0}]
    [result] = se.find_n_star([condition()], configs, fake_runner(lambda t: n_true, log), n0=16,
                              resolution=0, n_max=1 << 20, **NO_CAP)
    assert result.n_star == n_true and result.lo == n_true - 1
    assert len(log) <= 2 * math.ceil(math.log2(max(n_true, 16))) + 2
    assert len(result.trials) == len(log)
    assert [t["converged"] for t in result.trials] == [t["n"] >= n_true for t in log]


def test_noisy_search_returns_the_smallest_n_at_which_any_seed_converges():
    thresholds = {0: 700, 1: 333, 2: 1200}          # seed-dependent, monotone in n per seed
    configs = se.grid_configs([1e-3, 3e-3], [0, 1, 2])
    [result] = se.find_n_star([condition()], configs, fake_runner(lambda t: thresholds[t["seed"]]),
                              n0=8, resolution=0, **NO_CAP)
    assert result.n_star == 333
    ns = sorted({t["n"] for t in result.trials})
    assert all(len([t for t in result.trials if t["n"] == n]) == 6 for n in ns)   # every config at every n


def test_resolution_bounds_the_bracket_and_rounds_run_side_by_side():
    rounds = []
    conditions = [condition(2), condition(3), condition("joint")]
    truth = {2: 50, 3: 400, "joint": 90}
    results = se.find_n_star(conditions, [{"lr": 1.0, "seed": 0}], fake_runner(lambda t: truth[t["length"]]),
                             n0=16, resolution=0.1, on_round=lambda r, k: rounds.append(k), **NO_CAP)
    for result in results:
        true = truth[result.condition["length"]]
        assert result.lo < true <= result.n_star and result.n_star - result.lo <= max(1, 0.1 * result.n_star)
    assert rounds[0] == 3                            # one trial per open condition per round


def test_search_gives_up_at_n_max_or_the_data_capacity():
    [result] = se.find_n_star([condition()], [{"lr": 1.0, "seed": 0}], fake_runner(lambda t: 10 ** 9),
                              n0=16, n_max=100, **NO_CAP)
    assert result.n_star is None and [t["n"] for t in result.trials] == [16, 32, 64, 100]
    [capped] = se.find_n_star([condition(2)], [{"lr": 1.0, "seed": 0}], fake_runner(lambda t: 10 ** 9),
                              n0=4)                  # Z5 at length 2: 25 sequences, half kept for validation
    assert capped.n_star is None and capped.n_max == 25 - 12 and capped.trials[-1]["n"] == 13


def test_bad_search_arguments_raise():
    run = fake_runner(lambda t: 1)
    with pytest.raises(ValueError, match="n0 must be a positive int"):
        se.find_n_star([condition()], [{"lr": 1, "seed": 0}], run, n0=0, **NO_CAP)
    with pytest.raises(ValueError, match="resolution"):
        se.find_n_star([condition()], [{"lr": 1, "seed": 0}], run, resolution=1.5, **NO_CAP)
    with pytest.raises(ValueError, match=r"configs\[0\] lacks \['seed'\]"):
        se.find_n_star([condition()], [{"lr": 1}], run, **NO_CAP)
    with pytest.raises(ValueError, match="configs must be non-empty"):
        se.find_n_star([condition()], [], run, **NO_CAP)


def test_kappa_arithmetic():
    assert se.kappa({2: 100, 3: 200, 4: 300}, 150) == pytest.approx(4.0)
    assert se.kappa({2: 10, 3: 10}, 40) == pytest.approx(0.5)
    assert math.isnan(se.kappa({2: 10, 3: None}, 40)) and math.isnan(se.kappa({2: 10}, None))
    with pytest.raises(ValueError, match="positive"):
        se.kappa({2: 0}, 10)


def test_kappa_bounds_from_searches_that_hit_their_limit():
    def result(n_star, n_max=100):
        return se.NStar(condition(), n_star, 0, n_max)

    assert se.kappa_bounds([result(40), result(None, 93)], result(50)) == (pytest.approx((40 + 94) / 50), math.inf)
    assert se.kappa_bounds([result(40), result(60)], result(None, 199)) == (0.0, pytest.approx(100 / 200))
    assert se.kappa_bounds([result(40), result(60)], result(25)) == (pytest.approx(4.0), pytest.approx(4.0))
    low, high = se.kappa_bounds([result(None)], result(None))
    assert math.isnan(low) and math.isnan(high)


def test_kappa_rows_take_the_best_joint_model_ood_accuracy():
    conds = se.conditions(["lstm", "transformer"], ["Z5"], ["acot"], 3, model_options={"transformer": {"n_layers": 6}})
    assert [c["length"] for c in conds] == [2, 3, "joint"] * 2
    assert conds[2]["lengths"] == [2, 3] and conds[2]["ood_lengths"] == [6, 12]
    assert conds[3]["model_options"] == {"n_layers": 6}
    truth = {("lstm", 2): 40, ("lstm", 3): 80, ("lstm", "joint"): 30,
             ("transformer", 2): 40, ("transformer", 3): 80, ("transformer", "joint"): 200}

    def run(trials):
        out = []
        for t in trials:
            ok = t["n"] >= truth[(t["model"], t["length"])]
            out.append({**t, "converged": ok, "val_loss": 0.001 * (1 + t["seed"]),
                        "ood_acc_6": 0.9 - 0.1 * t["seed"], "ood_acc_12": 0.5})
        return out

    results = se.find_n_star(conds, se.grid_configs([1e-3], [0, 1]), run, n0=8, resolution=0, **NO_CAP)
    rows = {r["model"]: r for r in se.kappa_rows(results)}
    assert rows["lstm"]["kappa"] == pytest.approx(120 / 30) and rows["transformer"]["kappa"] == pytest.approx(0.6)
    assert rows["lstm"]["n_star_joint"] == 30 and rows["lstm"]["sum_n_star"] == 120
    assert rows["lstm"]["kappa_low"] == rows["lstm"]["kappa_high"] == pytest.approx(4.0)
    assert rows["lstm"]["ood_acc_6"] == pytest.approx(0.9)       # seed 0 has the lower val loss


def test_conditions_check_their_arguments():
    with pytest.raises(ValueError, match="formats: unknown format 'cott'"):
        se.conditions(["lstm"], ["Z5"], ["cott"], 4)
    with pytest.raises(ValueError, match="max_length"):
        se.conditions(["lstm"], ["Z5"], ["cot"], 1)
    with pytest.raises(ValueError, match=r"train: unknown options \['stepz'\]"):
        se.conditions(["lstm"], ["Z5"], ["cot"], 3, train={"stepz": 3})


def test_a_real_trial_row(tmp_path):
    [joint] = [c for c in se.conditions(["lstm"], ["Z3"], ["acot"], 3, model_options={"lstm": {"d_model": 8}},
                                        train={"steps": 12, "batch_size": 8, "val_size": 8, "eval_every": 4})
               if c["length"] == "joint"]
    row = se.train_trial({**joint, "n": 10, "lr": 1e-2, "seed": 0}, tmp_path / "run")
    assert row["n_train"] == 10 and row["steps_run"] == 12 and row["converged"] is False
    assert row["converged_step"] is None and np.isfinite(row["val_loss"]) and 0 <= row["val_accuracy"] <= 1
    assert set(row) >= {"ood_acc_6", "ood_acc_12"} and row["model"] == "lstm"
    import models

    assert models.load(tmp_path / "run").cfg.mixer == "lstm"


@pytest.mark.parametrize("model,fmt,task", [("transformer", "cot", "S5"), ("dense_ssm", "outcome", "Z5"),
                                            ("mamba", "acot", "A4xZ5")])
def test_every_study_model_format_and_group_trains_a_trial(tmp_path, model, fmt, task):
    options = {"transformer": {"d_model": 8, "n_layers": 3, "n_heads": 2}, "dense_ssm": {"d_model": 8},
               "mamba": {"d_model": 8, "d_state": 2}}
    [condition] = [c for c in se.conditions([model], [task], [fmt], 3, model_options=options,
                                            train={"steps": 4, "batch_size": 4, "val_size": 4, "eval_every": 2})
                   if c["length"] == 3]
    row = se.train_trial({**condition, "n": 8, "lr": 1e-3, "seed": 0}, tmp_path / "run")
    assert row["n_train"] == 8 and row["steps_run"] == 4 and np.isfinite(row["val_loss"])
    import models

    loaded = models.load(tmp_path / "run")
    assert loaded.cfg.mixer == {"transformer": "attention"}.get(model, model)
    assert loaded.cfg.n_layers == options[model].get("n_layers", loaded.cfg.n_layers)
