"""TransformerLens on our models: `names` (TL's hook names and cache keys to ours, act_name),
`run` (TL's forward arguments: return_type, stop_at_layer, start_at_layer, loss, bwd_hooks),
`surface` (the HookedTransformer attributes: W_E ... W_out, cfg's TL names, the tokenizer calls),
`circuits` (model.QK / model.OV as TL's FactoredMatrix, composition scores)."""
