"""Read one layer's hidden state out of llama.cpp while it decodes (for a trigger probe).

llama.cpp names every tensor of its compute graph; the residual stream after layer i is "l_out-i". Its
scheduler asks an eval callback, node by node, whether it wants a tensor's data; we say yes for that one
name and copy the last position's row once it is computed. Nothing else changes: the logits are the same
bit for bit (tests/test_backend_llamacpp.py). The callback runs for every graph node, so decoding is
slower while a tap is on (measured ~1 ms a token on 2 cores); without a probe there is no tap.
"""

from __future__ import annotations

import ctypes

import numpy as np

GGML_TYPE_F32 = 0


class _GgmlTensor(ctypes.Structure):
    """The head of ggml.h's `struct ggml_tensor` (llama.cpp as vendored by llama-cpp-python 0.3.x)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


_NAME_OFFSET = _GgmlTensor.name.offset


def layer_name(layer: int) -> bytes:
    """llama.cpp's name for the residual stream after layer `layer` (0-based; Hugging Face's
    hidden_states[layer + 1])."""
    return f"l_out-{layer}".encode()


class LayerTap:
    """An eval callback that keeps the last position's row of one named tensor, per decode."""

    def __init__(self, llama_cpp, layer: int, width: int) -> None:
        self.layer = layer
        self.name = layer_name(layer)
        self._name_z = self.name + b"\0"  # compared with the tensor's name bytes, its terminator included
        self.state = np.zeros(width, dtype=np.float32)
        self.fresh = False  # a decode has written `state` since the tap was installed
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_tensor)  # kept alive with the tap

    def _on_tensor(self, tensor: int, ask: bool, _user_data: int) -> bool:
        # Called for every node of every decode: the name is read as raw bytes first (the cheapest test).
        if ctypes.string_at(tensor + _NAME_OFFSET, len(self._name_z)) != self._name_z:
            return not ask  # not wanted; once computed, go on
        if ask:
            return True
        t = ctypes.cast(tensor, ctypes.POINTER(_GgmlTensor)).contents
        if t.type == GGML_TYPE_F32 and t.ne[0] == self.state.size and t.data:
            rows = int(t.ne[1])
            row = ctypes.cast(t.data + (rows - 1) * int(t.nb[1]), ctypes.POINTER(ctypes.c_float))
            self.state[:] = np.ctypeslib.as_array(row, shape=(self.state.size,))
            self.fresh = True
        return True


def install(llama, layer: int) -> LayerTap:
    """Give `llama` (a llama_cpp.Llama) a fresh context whose decodes feed a tap on `layer`."""
    import llama_cpp
    from llama_cpp import _internals

    from ..errors import InputError

    n_layer = llama_cpp.llama_model_n_layer(llama.model)
    if not 0 <= layer < n_layer:
        raise InputError(f"layer={layer} is outside this model's layers 0..{n_layer - 1}; pick one of those")
    tap = LayerTap(llama_cpp, layer, llama.n_embd())
    llama.context_params.cb_eval = tap.callback
    old = llama._ctx
    # The callback is a context parameter: the context is made again with it (weights stay loaded).
    llama._ctx = _internals.LlamaContext(model=llama._model, params=llama.context_params, verbose=False)
    old.close()
    return tap
