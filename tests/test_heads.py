"""Per-head DeltaNet analysis: statistics on constructed arrays, exact no-op clamps, Triton ablation
path == chunked, linear belief mass vs its closed form, and the `interp heads` CLI."""

import math

import numpy as np
import pytest
import torch

import models
from interp.analysis import heads
from interp.tasks import make_task
from probes import heads as head_probes
from tests.conftest import triton_interpreter_available
from tests.browser import assert_renders


def small_deltanet(scales, bias, d_model=16, n_layers=1, vocab=12, **overrides):
    torch.manual_seed(0)
    model = models.build("deltanet", vocab_size=vocab, d_model=d_model, n_heads=len(scales), n_layers=n_layers,
                         beta_scale=list(scales), **overrides)
    with torch.no_grad():
        for block in model.blocks:
            block.mixer.beta_proj.bias.copy_(torch.tensor(bias, dtype=torch.float32))
    return model.eval()


# ----------------------------------------------------------------------------- probes.heads


def test_fraction_above_and_min_eigenvalue_on_constructed_betas():
    beta = torch.tensor([[[0.5, 1.5, 1.0], [0.9, 2.0, 1.0]], [[0.1, 0.2, 1.0], [1.0, 1.9, 1.0]]])  # [2, 2, 3]
    np.testing.assert_allclose(head_probes.fraction_above(beta), [0.0, 0.75, 0.0])   # beta == 1 is not > 1
    np.testing.assert_allclose(head_probes.min_transition_eigenvalue(beta), [0.0, -1.0, 0.0])
    edges, counts = head_probes.beta_histogram(beta, bins=4, range=(0.0, 2.0))
    np.testing.assert_allclose(edges, [0, 0.5, 1.0, 1.5, 2.0])
    assert counts.tolist() == [[1, 2, 1, 0], [1, 0, 0, 3], [0, 0, 4, 0]]
    with pytest.raises(ValueError, match="range"):
        head_probes.beta_histogram(beta, range=(1.0, 1.0))


@pytest.mark.parametrize("rank", [1, 2, 5])
def test_effective_rank_of_a_constructed_rank_r_state_is_r(rank):
    g = torch.Generator().manual_seed(rank)
    V = K = 8
    u, _ = torch.linalg.qr(torch.randn(V, rank, generator=g, dtype=torch.float64))
    w, _ = torch.linalg.qr(torch.randn(K, rank, generator=g, dtype=torch.float64))
    equal = (3.0 * u @ w.T).expand(2, 3, 1, V, K)                         # r equal singular values
    scales = torch.linspace(1.0, 5.0, rank, dtype=torch.float64)
    unequal = ((u * scales) @ w.T).expand(2, 3, 1, V, K)
    np.testing.assert_allclose(head_probes.state_rank(equal), rank, rtol=1e-9)
    assert (head_probes.state_rank(unequal, method="count") == rank).all()
    p = (scales / scales.sum()).numpy()
    np.testing.assert_allclose(head_probes.state_rank(unequal), np.exp(-(p * np.log(p)).sum()), rtol=1e-9)
    if rank > 1:                                                             # unequal: strictly below r
        assert (head_probes.state_rank(unequal) < rank).all()
    assert head_probes.effective_rank(torch.zeros(4)).item() == 0


def test_trajectory_rank_counts_the_dimension_the_state_moves_in():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 4, 4, generator=g)                                # [dim, V, K]
    coeff = torch.randn(5, 7, 3, generator=g)                               # [B, T, dim]
    states = torch.einsum("btd,dvk->btvk", coeff[..., :2], base[:2]) + base[2]   # 2-dim affine trajectory
    states = torch.stack([states, torch.einsum("btd,dvk->btvk", coeff, base)], dim=2)   # heads: 2 and 3 dims
    assert head_probes.trajectory_rank(states, method="count", rtol=1e-5).tolist() == [2, 3]


def test_head_statistics_rows_and_shape_errors():
    beta = torch.rand(2, 5, 3) * 2
    states = torch.randn(2, 5, 3, 4, 4)
    rows = head_probes.head_statistics(beta, states).rows(layer=1)
    assert [r["head"] for r in rows] == [0, 1, 2] and all(r["layer"] == 1 for r in rows)
    assert rows[1]["frac_beta>1"] == pytest.approx(float((beta[..., 1] > 1).double().mean()))
    with pytest.raises(ValueError, match="states"):
        head_probes.head_statistics(beta, states[..., 0])
    with pytest.raises(ValueError, match="must match"):
        head_probes.head_statistics(beta[:, :4], states)
    with pytest.raises(ValueError, match="method"):
        head_probes.state_rank(states, method="nuclear")


# ----------------------------------------------------------------------------- ablations


def repl_batch(vocab_check: int, n=6, length=3):
    task = make_task("REPL", n_vars=3, loss="reveals")
    assert task.vocab_size == vocab_check
    return task.sample(n, length, seed=3)


@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_clamping_a_head_whose_beta_never_exceeds_1_changes_nothing(path):
    model = small_deltanet([1.0, 2.0], bias=[0.0, 3.0])         # head 0: beta in [0, 1]; head 1 mostly > 1
    batch = repl_batch(model.cfg.vocab_size)
    (beta, _), = heads.head_activations(model, batch, states=False).values()
    assert float(beta[..., 0].max()) <= 1.0 and float(beta[..., 1].max()) > 1.0
    with torch.no_grad(), heads.kernel_settings(model, path):
        clean = model(batch.tokens)
        with heads.beta_clamped(model, 0, 0, 0.0, 1.0):
            head0 = model(batch.tokens)
        with heads.beta_clamped(model, 0, 1, 0.0, 1.0):
            head1 = model(batch.tokens)
    assert torch.equal(head0, clean)
    assert (head1 - clean).abs().max() > 1e-3
    assert model.blocks[0].mixer.beta_clamp is None                  # restored
    result = heads.ablate_heads(model, batch, path=path)
    assert result.accuracy("clamp")[(0, 0)] == result.baseline
    assert [(r["layer"], r["head"], r["mode"]) for r in result.rows] == [
        (0, 0, "clamp"), (0, 0, "mean"), (0, 1, "clamp"), (0, 1, "mean")]


def test_mean_pin_uses_the_heads_mean_beta():
    model = small_deltanet([1.0, 2.0], bias=[0.0, 3.0])
    batch = repl_batch(model.cfg.vocab_size)
    (beta, _), = heads.head_activations(model, batch, states=False).values()
    rows = heads.ablate_heads(model, batch, modes=["mean"]).rows
    for row in rows:
        assert row["lo"] == row["hi"] == pytest.approx(float(beta[..., row["head"]].double().mean()))
    with pytest.raises(ValueError, match="modes"):
        heads.ablate_heads(model, batch, modes=["zero"])


@pytest.mark.triton
@pytest.mark.skipif(not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)")
def test_triton_ablation_path_equals_chunked():
    model = small_deltanet([1.0, 2.0], bias=[0.0, 3.0], d_model=8)
    batch = repl_batch(model.cfg.vocab_size, n=2, length=1)
    tokens = batch.tokens[:, :8]
    logits = {}
    for impl in ("chunked", "triton"):
        for path in ("fast", "instrumented"):
            with torch.no_grad(), heads.kernel_settings(model, path, impl), heads.beta_clamped(model, 0, 1, 0.0, 1.0):
                logits[impl, path] = model(tokens)
    assert model.blocks[0].mixer.options["impl"] == "auto"           # restored
    for path in ("fast", "instrumented"):
        torch.testing.assert_close(logits["triton", path], logits["chunked", path], atol=1e-5, rtol=1e-4)
    clean = model(tokens)
    assert (logits["triton", "fast"] - clean).abs().max() > 1e-3    # the clamp did act on the Triton path


def test_ablation_rejects_models_without_delta_layers():
    model = models.build("tanh_rnn", vocab_size=12, d_model=8, n_layers=1)
    with pytest.raises(ValueError, match="DeltaNet"):
        heads.ablate_heads(model, repl_batch(12))


# ----------------------------------------------------------------------------- PFSA beliefs


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_linear_belief_mass_matches_the_closed_form(p):
    """n = 2, a reveal of slot 0 after every swap: the mass after k reveals is p^c (1 - p)^(k - c),
    c = the number of reveals whose item differs from the previous one (the swap happened)."""
    task = make_task("PFSA", n_items=2, p=p, reveal_every=1, reveal="adversarial")
    batch = task.sample(16, 12, seed=0)
    u = heads.linear_belief(task, batch.tokens)
    mass = heads.belief_mass(u)
    _, ask_pos = task.layout(12)
    items = (batch.tokens[:, ask_pos + 1] - task.item_ids.start).numpy()           # [N, R]
    changes = np.cumsum(items != np.concatenate([np.zeros((16, 1), int), items[:, :-1]], axis=1), axis=1)
    k = np.arange(1, len(ask_pos) + 1)
    np.testing.assert_allclose(mass[:, ask_pos + 1], p ** changes * (1 - p) ** (k - changes), rtol=1e-12)
    # normalising the linear recursion gives the exact belief the task computes
    np.testing.assert_allclose(u / mass[..., None], batch.states.numpy(), atol=1e-6)
    if p == 0.5:
        assert heads.decay_rate(mass[:, ask_pos + 1]) == pytest.approx(math.log(0.5))


def test_decay_rate_of_a_geometric_sequence_and_errors():
    assert heads.decay_rate(3.0 * 0.8 ** np.arange(10)) == pytest.approx(math.log(0.8))
    with pytest.raises(ValueError, match="positive"):
        heads.decay_rate(np.zeros(5))
    with pytest.raises(TypeError, match="PFSA"):
        heads.linear_belief(make_task("REPL"), torch.zeros(2, 3, dtype=torch.long))


def test_belief_probe_recovers_beliefs_from_a_model_state():
    task = make_task("PFSA", n_items=3, reveal_every=2)
    batch = task.sample(40, 6, seed=1)
    model = models.build("tanh_rnn", vocab_size=task.vocab_size, d_model=16, n_layers=1)
    report = heads.belief_probe(model, batch, alpha=1e-3)
    assert report.metric == "r2" and report.per_position.shape == (batch.tokens.shape[1],)
    norms = heads.state_norms(model, batch)
    assert norms.shape == tuple(batch.tokens.shape) and (norms > 0).all()


# ----------------------------------------------------------------------------- CLI


def test_heads_cli_runs_on_a_tiny_trained_run(tmp_path, capsys):
    from interp.cli import main
    from interp.training.train import TrainConfig, train

    task = make_task("REPL", n_vars=3, loss="reveals")
    config = models.preset_config("deltanet_neg", vocab_size=task.vocab_size, d_model=16, n_heads=2, n_layers=1)
    train(config, task, TrainConfig(steps=3, batch_size=4, warmup=1, train_length=2, eval_every=3, eval_size=4),
          tmp_path / "run", progress=False)
    assert main(["heads", str(tmp_path / "run"), "--n", "6"]) == 0
    out = capsys.readouterr().out
    assert "unablated reveal accuracy" in out and "acc_clamp01" in out
    html = (tmp_path / "run" / "heads.html").read_text()
    assert "Per-head summary" in html and html.count("<tr>") == 1 + 2     # header + 2 heads
    assert_renders(tmp_path / "run" / "heads.html")
    assert main(["heads", str(tmp_path / "missing")]) == 2
