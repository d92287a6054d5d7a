"""The native CPU kernels: plain C (kernels.c and one *_body.h per family, compiled on first use
with the system compiler) and their Python faces, one module per op family:

    library.py    compiler discovery, the build into $INTERP_SEQ_CACHE, the ctypes load (AVX-512
                  and AVX2 clones picked by the loader), available() / unavailable_reason(), empty()
                  (huge-page-advised outputs), function() / ptr() for calling the C code
    diag.py       the diagonal scan, forward and checkpointed backward (diag_scan's impl="native")
    delta.py      the delta-rule forward (delta_rule's impl="native")
    selective.py  Mamba's selective scan with the discretisation fused: selective_scan (read-out)
                  and selective_states (every state), both differentiable; exp_f32
    complex.py    AUSSM's and Mamba-3's complex-transition scans: rotation_* / trapezoid_* scans
                  and states; sincos_f32
    softmax.py    causal attention scores and pattern from q, k in one pass (the attention readers)
    lstm.py       the LSTM recurrence with every gate and state, differentiable (its instrumented path)
    rwkv7.py      the RWKV-7 scan, forward and checkpointed backward, state export, shift and pins
                  (models.kernels.rwkv7's impl="native")
"""
