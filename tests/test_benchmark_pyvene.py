"""benchmarks/pyvene_peer.py (the pyvene contender of the interchange benchmarks): pyvene's patched
answer probabilities on a tiny float64 Mamba, hook_state [B, T, E, N] included, agree with
interchange's whole passes to rounding (a source pass per site, or the clean activations handed
over as source_representations), and every state patch changes them (an untrained model's
changes are ~1e-6: float64 keeps them far above the rounding; a no-op adapter would fail)."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("pyvene")
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_pyvene_grid_matches_interchange(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from pyvene_peer import PyveneGrid

    import models
    from interp.analysis.interventions import Site, corrupt_ar, interchange
    from interp.tasks import make_task

    torch.manual_seed(0)
    task = make_task("AR", n_keys=6, n_values=6)
    clean = task.sample(16, 3, seed=0)
    corrupt = corrupt_ar(clean, task, seed=1)
    model = models.build("mamba", vocab_size=task.vocab_size, d_model=16, n_layers=2, d_state=4).eval().double()
    sites = [Site(f"blocks.{l}.{h}", t) for l in (0, 1) for h in ("hook_resid_pre", "mixer.hook_out", "mixer.hook_state")
             for t in (1, 4)] + [Site("blocks.0.mixer.hook_state", "key")]
    exact = interchange(model, clean, corrupt, sites, min_effect=0.0, skip_noops=False, resume=False)
    state = [i for i, s in enumerate(sites) if s.hook.endswith("hook_state")]
    for cached, calls in ((False, 2 * len(sites)), (True, len(sites))):  # source + base pass / base pass per site
        peer = PyveneGrid(model, cached_sources=cached)
        p = peer(clean, corrupt, sites)
        assert p.shape == exact.p_patched.shape
        assert (p - exact.p_patched).abs().max().item() < 1e-12  # float64: rounding only
        assert (p[state] - exact.p_corrupt).abs().amax(1).min().item() > 1e-8  # every state patch took effect
        assert peer.adapter.calls == calls
    assert type(model.blocks[0].mixer.hook_state) is models.hooks.HookPoint  # the model itself is untouched
    sys.modules.pop("pyvene_peer", None)
