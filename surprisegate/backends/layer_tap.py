"""Read one layer's hidden state out of llama.cpp while it decodes (for a trigger probe).

llama.cpp names every tensor of its compute graph; the residual stream after layer i is "l_out-i". Its
scheduler asks an eval callback, node by node, whether it wants a tensor's data; we say yes for that one
name and copy the last position's row once it is computed. Nothing else changes: the logits are the same
bit for bit (tests/test_backend_llamacpp.py). The callback runs for every graph node: in Python that
cost ~1 ms a token on 2 cores, so it is compiled from layer_tap.c once per machine (a C compiler and the
ggml.h llama-cpp-python installs) into $SURPRISEGATE_HOME/lib; where that cannot be done, the Python
callback below does the same work, slower.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

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


class _NativeTapState(ctypes.Structure):
    """layer_tap.c's `struct surprisegate_tap`: the callback's user data."""

    _fields_ = [
        ("name", ctypes.c_char * 64),
        ("width", ctypes.c_int64),
        ("out", ctypes.POINTER(ctypes.c_float)),
        ("fresh", ctypes.c_int32),
        ("paused", ctypes.c_int32),
    ]


class LayerTap:
    """An eval callback that keeps the last position's row of one named tensor, per decode: the compiled
    one when `native` (layer_tap.c) is given, else a Python one."""

    def __init__(self, llama_cpp, layer: int, width: int, native: ctypes.CDLL | None = None) -> None:
        self.layer = layer
        self.name = layer_name(layer)
        self._name_z = self.name + b"\0"  # compared with the tensor's name bytes, its terminator included
        self.state = np.zeros(width, dtype=np.float32)
        self._fresh = False  # a decode has written `state` since the tap was installed (Python callback)
        self._paused = False  # keep nothing (Python callback)
        self.native = native is not None
        self.user_data: int | None = None
        if native is None:
            self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_tensor)  # kept alive with the tap
        else:
            out = self.state.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            self._native_state = _NativeTapState(self.name, width, out, 0, 0)  # kept alive with the tap
            self.user_data = ctypes.addressof(self._native_state)
            self.callback = ctypes.cast(native.surprisegate_tap_eval, llama_cpp.ggml_backend_sched_eval_callback)

    @property
    def fresh(self) -> bool:
        """Whether a decode has written `state` since the tap was installed."""
        return bool(self._native_state.fresh) if self.native else self._fresh

    def pause(self, paused: bool = True) -> None:
        """Keep no state until unpaused: the scheduler then runs each graph whole, as without a tap (a decode
        whose state no probe reads need not pay for it). The state kept before is no longer current."""
        if self.native:
            self._native_state.paused = int(paused)
            if paused:
                self._native_state.fresh = 0
        else:
            self._paused = paused
            if paused:
                self._fresh = False

    def _on_tensor(self, tensor: int, ask: bool, _user_data: int) -> bool:
        # Called for every node of every decode: the name is read as raw bytes first (the cheapest test).
        if self._paused or ctypes.string_at(tensor + _NAME_OFFSET, len(self._name_z)) != self._name_z:
            return not ask  # not wanted; once computed, go on
        if ask:
            return True
        t = ctypes.cast(tensor, ctypes.POINTER(_GgmlTensor)).contents
        if t.type == GGML_TYPE_F32 and t.ne[0] == self.state.size and t.data:
            rows = int(t.ne[1])
            row = ctypes.cast(t.data + (rows - 1) * int(t.nb[1]), ctypes.POINTER(ctypes.c_float))
            self.state[:] = np.ctypeslib.as_array(row, shape=(self.state.size,))
            self._fresh = True
        return True


_SOURCE = Path(__file__).with_name("layer_tap.c")


def _ggml_paths(llama_cpp) -> tuple[Path, Path] | None:
    """The ggml.h and libggml-base llama-cpp-python installed (its wheel ships both), if found."""
    package = Path(llama_cpp.__file__).parent
    include = package.parent / "include"
    libs = sorted((package / "lib").glob("libggml-base.*"))
    if not (include / "ggml.h").is_file() or not (include / "ggml-backend.h").is_file() or not libs:
        return None
    return include, libs[0]


@lru_cache(maxsize=1)
def native_callback() -> ctypes.CDLL | None:
    """layer_tap.c compiled (once per machine and llama-cpp-python build) and loaded, or None where that
    cannot be done (the Python callback is then used, and a warning says why)."""
    import llama_cpp

    from ..native import build

    paths = _ggml_paths(llama_cpp)
    if paths is None:
        log.warning("layer tap: no ggml.h beside llama_cpp; the Python callback reads the layer (~1 ms a token)")
        return None
    include, lib = paths
    # Keyed by the headers it was compiled against too: a new llama-cpp-python builds anew.
    flags, link = ["-O2", f"-I{include}", f"-Wl,-rpath,{lib.parent}"], [str(lib)]
    try:
        target = build(_SOURCE, "layer_tap", flags, link, key_extra=(include / "ggml.h").read_bytes())
    except (OSError, RuntimeError) as err:  # no compiler, an unwritable home, a failed compile
        log.warning("layer tap: compiling %s failed, using the Python callback:\n%s", _SOURCE, err)
        return None
    native = ctypes.CDLL(str(target))
    native.surprisegate_tap_name_size.restype = ctypes.c_size_t
    if native.surprisegate_tap_name_size() != _NativeTapState.name.size:  # the struct mirrored above
        log.warning("layer tap: this ggml's GGML_MAX_NAME is not 64; using the Python callback")
        return None
    return native


class RowsTap:
    """An eval callback that keeps every position's row of several layers (a calibration keeps the states of
    the replies it labels): the Python fallback of NativeRowsTap, where layer_tap.c cannot be compiled. Cheap
    for a whole sequence in one pass (one graph), ~1 ms a token while decoding one token at a time."""

    def __init__(self, llama_cpp, layers: Sequence[int], width: int) -> None:
        self.width = width
        self._wanted = {layer_name(layer) + b"\0": layer for layer in layers}
        self._longest = max(len(name) for name in self._wanted)
        self.rows: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_tensor)
        self.user_data = None
        self._paused = False

    def clear(self) -> None:
        for kept in self.rows.values():
            kept.clear()

    def pause(self, paused: bool = True) -> None:
        """Keep no rows until unpaused."""
        self._paused = paused

    def states(self) -> dict[int, np.ndarray]:
        """Each layer's rows since `clear`, one per position fed (ubatches in order)."""
        return {
            layer: np.concatenate(kept) if kept else np.zeros((0, self.width), np.float32)
            for layer, kept in self.rows.items()
        }

    def _on_tensor(self, tensor: int, ask: bool, _user_data: int) -> bool:
        if self._paused:
            return not ask
        head = ctypes.string_at(tensor + _NAME_OFFSET, self._longest)
        layer = next((n for name, n in self._wanted.items() if head.startswith(name)), None)
        if layer is None:
            return not ask
        if ask:
            return True
        t = ctypes.cast(tensor, ctypes.POINTER(_GgmlTensor)).contents
        if t.type == GGML_TYPE_F32 and t.ne[0] == self.width and t.data and int(t.nb[1]) == self.width * 4:
            rows = int(t.ne[1])
            data = ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float))
            self.rows[layer].append(np.ctypeslib.as_array(data, shape=(rows, self.width)).copy())
        return True


class _NativeRowsState(ctypes.Structure):
    """layer_tap.c's `struct surprisegate_rows`."""

    _MAX = 8  # SURPRISEGATE_ROWS_MAX_LAYERS
    _fields_ = [
        ("names", (ctypes.c_char * 64) * _MAX),
        ("n_layers", ctypes.c_int32),
        ("width", ctypes.c_int64),
        ("capacity", ctypes.c_int64),
        ("out", ctypes.POINTER(ctypes.c_float) * _MAX),
        ("count", ctypes.c_int64 * _MAX),
        ("paused", ctypes.c_int32),
    ]


class NativeRowsTap:
    """RowsTap's work in C (layer_tap.c): while decoding one token at a time, the Python callback's cost per
    graph node slowed a 0.5B model's labelling by a third. Rows go into buffers of `capacity` positions (a
    context's size) per layer; `states()` refuses to guess past them."""

    def __init__(self, llama_cpp, layers: Sequence[int], width: int, capacity: int, native: ctypes.CDLL) -> None:
        if len(layers) > _NativeRowsState._MAX:
            raise ValueError(f"at most {_NativeRowsState._MAX} layers at once, not {len(layers)}")
        self.width, self.layers = width, list(layers)
        self._buffers = [np.zeros((capacity, width), dtype=np.float32) for _ in self.layers]
        self._state = _NativeRowsState()
        self._state.n_layers, self._state.width, self._state.capacity = len(self.layers), width, capacity
        for i, (layer, buffer) in enumerate(zip(self.layers, self._buffers, strict=True)):
            self._state.names[i].value = layer_name(layer)
            self._state.out[i] = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self.user_data = ctypes.addressof(self._state)
        self.callback = ctypes.cast(native.surprisegate_rows_eval, llama_cpp.ggml_backend_sched_eval_callback)

    def clear(self) -> None:
        for i in range(len(self.layers)):
            self._state.count[i] = 0

    def pause(self, paused: bool = True) -> None:
        """Keep no rows until unpaused: the scheduler then runs each graph whole, as without a tap (a reply
        whose states nobody reads need not pay for them)."""
        self._state.paused = int(paused)

    def states(self) -> dict[int, np.ndarray]:
        """Each layer's rows since `clear`, one per position fed (ubatches in order)."""
        out = {}
        for i, (layer, buffer) in enumerate(zip(self.layers, self._buffers, strict=True)):
            n = int(self._state.count[i])
            if n > len(buffer):
                raise RuntimeError(f"layer {layer}: {n} rows since the last clear, more than the {len(buffer)} kept")
            out[layer] = buffer[:n].copy()
        return out


def rows_tap(llama_cpp, layers: Sequence[int], width: int, capacity: int) -> RowsTap | NativeRowsTap:
    """The compiled rows tap where layer_tap.c could be built, else the Python one."""
    native = native_callback()
    if native is None or native.surprisegate_rows_max_layers() != _NativeRowsState._MAX:  # the struct mirrored
        return RowsTap(llama_cpp, layers, width)
    return NativeRowsTap(llama_cpp, layers, width, capacity, native)


def check_layer(llama, layer: int) -> None:
    from ..errors import InputError

    n_layer = n_layers(llama)
    if not 0 <= layer < n_layer:
        raise InputError(f"layer={layer} is outside this model's layers 0..{n_layer - 1}; pick one of those")


def n_layers(llama) -> int:
    import llama_cpp

    return int(llama_cpp.llama_model_n_layer(llama.model))


def install(llama, layer: int) -> LayerTap:
    """Give `llama` (a llama_cpp.Llama) a fresh context whose decodes feed a tap on `layer`."""
    import llama_cpp

    check_layer(llama, layer)
    tap = LayerTap(llama_cpp, layer, llama.n_embd(), native_callback())
    install_callback(llama, tap.callback, tap.user_data)
    return tap


def install_callback(llama, callback, user_data) -> None:
    """Make `llama`'s context again with this eval callback (None: none); the weights stay loaded."""
    import llama_cpp
    from llama_cpp import _internals

    llama.context_params.cb_eval = callback if callback is not None else llama_cpp.ggml_backend_sched_eval_callback()
    llama.context_params.cb_eval_user_data = user_data
    old = llama._ctx
    # The callback is a context parameter: the context is made again with it.
    llama._ctx = _internals.LlamaContext(model=llama._model, params=llama.context_params, verbose=False)
    old.close()
