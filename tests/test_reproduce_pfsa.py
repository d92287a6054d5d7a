"""`interp reproduce pfsa`: the linear belief recursions (interp.analysis.heads) against closed forms -
(1 - p)^k on the constructed sequences, the product of Bayes predictive probabilities on random ones,
exact agreement with the task's beliefs where nothing is lost (swaps only, full reveals), float32
reaching 0 at the predicted round - and the trained claim's verdict logic on hand-made outcomes."""

import numpy as np
import pytest
import torch

from interp.analysis import heads
from interp.reproduce import claim_module, pfsa
from interp.reproduce.engine import VERDICTS, Outcome
from interp.tasks import make_task


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_adversarial_sequence_drains_the_unrevealed_slot_as_the_closed_form(p):
    task = make_task("PFSA", n_items=3, p=p, reveal_every=1)
    tokens = heads.adversarial_tokens(task, 40)
    M = heads.linear_marginals(task, tokens)                                          # [1, T, 3, 3]
    k = np.arange(1, 41)
    np.testing.assert_allclose(M[0, 2::3, 2].sum(-1), (1 - p) ** k, rtol=1e-12)        # slot 2, never revealed
    np.testing.assert_array_equal(M[0, 2::3, 0], np.broadcast_to([1.0, 0, 0], (40, 3)))  # slot 0: injected e_0
    np.testing.assert_array_equal(M[0, 2::3, 1], np.broadcast_to([0, 1.0, 0], (40, 3)))  # slot 1: never touched
    # the exact normalised belief on the same path keeps slot 2 at mass 1 (holding item 2)
    u = heads.linear_belief(task, tokens)
    exact = task.marginals(torch.from_numpy(u / heads.belief_mass(u)[..., None]))
    np.testing.assert_allclose(exact[0, 2::3, 2].numpy(), np.broadcast_to([0, 0, 1.0], (40, 3)), atol=1e-12)
    np.testing.assert_allclose(heads.belief_mass(u)[0, 2::3], (1 - p) ** k, rtol=1e-12)


def test_float32_marginal_reaches_zero_where_the_closed_form_rounds_to_zero():
    task = make_task("PFSA", n_items=3, p=0.5, reveal_every=1)
    mass = heads.linear_marginals(task, heads.adversarial_tokens(task, 155), np.float32)[0, 2::3, 2].sum(-1)
    assert mass.dtype == np.float32
    assert mass[148] == np.float32(2.0 ** -149) and (mass[149:] == 0).all()          # round 150: 2^-150 -> 0
    e = pfsa.exact(dict(pfsa.SCALE["quick"], rounds=155))
    assert e["float32_zero_round"] == e["float32_zero_predicted"] == 150
    assert e["joint_rel_error"] == 0.0 and e["marginal_rel_error"] == 0.0


def test_swaps_alone_are_exact_for_the_linear_marginals():
    """Before the first reveal nothing is pruned: the linear marginal recursion is the exact marginal."""
    task = make_task("PFSA", n_items=4, p=0.3, reveal_every=6, init="uniform")
    batch = task.sample(16, 6, seed=3)
    M = heads.linear_marginals(task, batch.tokens)
    np.testing.assert_allclose(M[:, :6], task.marginals(batch.states[:, :6].double()).numpy(), atol=1e-6)


def test_full_reveal_restores_the_mass_and_both_recursions_agree_with_the_task():
    task = make_task("PFSA", n_items=3, p=0.5, reveal_every=2, full_every=3)
    batch = task.sample(32, 12, seed=4)
    u = heads.linear_belief(task, batch.tokens)
    mass = heads.belief_mass(u)
    np.testing.assert_allclose(u / mass[..., None], batch.states.numpy(), atol=1e-6)   # normalised: the exact belief
    ask, fixed = task.layout(12)[1], task.fixed_slots(12)
    ends = ask[fixed == 2] + 1                                                          # last ITEM of each full reveal
    np.testing.assert_array_equal(mass[:, ends], 1.0)
    M = heads.linear_marginals(task, batch.tokens)
    np.testing.assert_allclose(M[:, ends], task.marginals(batch.states[:, ends].double()).numpy(), atol=1e-6)


def test_random_sequence_mass_is_the_product_of_bayes_predictive_probabilities():
    r = pfsa.random_sequences(pfsa.SCALE["cpu"] | {"random_n": 64})
    assert r["closed_form_rel_error"] < pfsa.STATES_RTOL
    assert r["mass_after_full_reveals"] == 1.0
    by_k = list(r["log2_mass_by_k"].values())
    assert all(b < a for a, b in zip(by_k, by_k[1:])) and r["bits_per_partial_reveal"] < -0.5


def test_bad_input_to_the_recursions():
    with pytest.raises(TypeError, match="PFSA"):
        heads.linear_marginals(make_task("REPL"), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens must be"):
        heads.linear_marginals(make_task("PFSA"), torch.zeros(3, dtype=torch.long))


def fake(plan, agreement):
    """Outcomes with measured agreement(model, condition, k) for every run of `plan`."""
    done = []
    for run in plan.runs:
        by_k = {c: {"by_k": {str(k): {"agreement": agreement(run.info["model"], c, k), "accuracy": 0.5,
                                      "bayes_accuracy": 0.6, "uniform_agreement": 0.77, "probe_r2": 0.5,
                                      "state_norm": 1.0} for k in range(8)},
                    "norm_curve": [1.0] * 10} for c in ("with full reveals", "no full reveal")}
        done.append(Outcome(run, "fit", None, 3e-3, run.train["train_length"], 0.95, [], 1.0, measures=by_k))
    return done


def test_trained_verdicts():
    module = claim_module("pfsa")
    plan = module.plan("cpu")
    plan.settings["study"] = pfsa.exact(pfsa.SCALE["quick"])

    def falls(model, c, k):
        return 0.99 if model != "deltanet[-1,1]" or c != "no full reveal" else 0.99 - 0.03 * k

    claims, sections = module.judge(fake(plan, falls), plan)
    assert [c.verdict for c in claims] == ["reproduces"] * 3 and sections
    claims, _ = module.judge(fake(plan, lambda m, c, k: 0.98), plan)
    assert claims[2].verdict == "does not reproduce"
    done = fake(plan, falls)
    for o in done:
        o.status = "did not fit" if o.run.info["kind"] == "nonlinear" else "fit"
    assert module.judge(done, plan)[0][2].verdict == "did not fit"
    for o in done:
        o.status = "fit" if o.run.info["kind"] == "nonlinear" else "did not fit"
    claims, _ = module.judge(done, plan)
    assert claims[2].verdict == "partly reproduces" and "did not reach" in claims[2].measured
    assert all(c.verdict in VERDICTS for c in claims)
