"""Memory for the long-input case: an estimate before running, the measured peak after.

Estimate (bytes, float32, batch 1, forward + backward) for T tokens, vocabulary V, L attention
layers of H heads, width d and P parameters:

    need = logits_copies * T * V * 4            logits, log-softmax, their gradients, loss temporaries
         + attention_copies * L * H * T^2 * 4   scores, mask, softmax, kept for backward, gradients
         + activation_copies * L * T * d * 4    per-layer activations (MLP 4d, norms, residuals)
         + 3 * P * 4                            parameters, gradients, returned gradients

The copy counts are profile settings (`[stress] memory_*_copies`). The defaults are conservative:
MindSpore 2.10's nn.CrossEntropyLoss peaks at ~37 copies of the logits on CPU (9.4 GiB at
T=2048, V=32000), and the demo TinyCausalLM (2 layers, 4 heads) measured 2.8 GiB above its
baseline at T=2048 and 10.4 GiB at T=4096, i.e. ~21 T x T float32 copies per head and layer
in graph mode on CPU (scores, scaling, mask, softmax, and their gradients are all kept).
What the model does not tell (heads, layers, width) is taken from the profile's `assume_*`
settings, on the large side. A case runs only if need * memory_safety <= MemAvailable.

Calibration (preferred): the peak of forward + backward measured at a few short lengths (the
stress short length and `memory_calibration_lengths`, in increasing order, as the process's
absolute peak RSS: MindSpore's memory pool only grows, so a per-run delta undercounts), fitted
as a + bT + cT^2 (`fit_peaks`), predicts the long lengths (what a length adds: predicted peak
minus the RSS now, at least one copy of the logits and attention scores, `floor_bytes`); the static estimate
above is then only reported as an upper bound, and is the rule where calibration cannot run
(no /proc, a peak that cannot be reset, fewer than two lengths).

Measured peak: the process's resident-set high-water mark, VmHWM in /proc/self/status. Writing
"5" to /proc/self/clear_refs resets it to the current RSS (Linux >= 4.0), so peak - RSS before
the case is the case's own peak. Where the reset is refused the HWM only rises, and the delta is a
lower bound ("hwm-delta" method). tracemalloc does not see MindSpore's native allocations.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

GIB = 1024 ** 3


def _status_kib(field: str) -> int | None:
    from objdebug.engine.host_memory import status_bytes

    value = status_bytes(field)
    return None if value is None else value // 1024


def rss_bytes() -> int:
    """The process's resident set now (0 where there is no /proc)."""
    from objdebug.engine.host_memory import rss_bytes as process_rss

    return process_rss()


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no /proc), this worker's share of it:
    under `--workers N` every worker runs the long inputs at the same time on one machine."""
    from objdebug.engine.distributed import world
    from objdebug.engine.host_memory import available_bytes as machine_available

    avail = machine_available()
    return None if avail is None else avail // world().size


class PeakRss:
    """`with PeakRss() as p: ...` then p.peak_bytes, p.delta_bytes, p.method."""

    def __enter__(self) -> "PeakRss":
        self.method = "vmhwm-reset"
        from objdebug.engine import host_memory

        host_memory.before_hwm_reset()  # the run's peak so far survives the reset
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
        except OSError:
            self.method = "hwm-delta"
        self.before_kib = (_status_kib("VmRSS") if self.method == "vmhwm-reset"
                           else _status_kib("VmHWM")) or 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.peak_kib = _status_kib("VmHWM") or 0

    @property
    def peak_bytes(self) -> int:
        return self.peak_kib * 1024

    @property
    def delta_bytes(self) -> int:
        return max(0, self.peak_kib - self.before_kib) * 1024


def model_shape(model: Any, vocab: int, th: dict[str, Any]) -> dict[str, Any]:
    """Layers, heads and width read from the model's Cells where it tells them, else assumed."""
    layers, heads, width, told = 0, [], None, []
    if model is not None:
        for _, cell in model.cells_and_names():
            if "attention" in type(cell).__name__.lower():
                layers += 1
                for attr in ("n_heads", "num_heads", "num_attention_heads", "n_head", "head_num"):
                    h = getattr(cell, attr, None)
                    if isinstance(h, int) and h > 0:
                        heads.append(h)
                        break
        for p in model.trainable_params():
            if len(p.shape) == 2 and vocab in p.shape:  # embedding or LM head: [V, d] or [d, V]
                width = int(p.shape[1] if p.shape[0] == vocab else p.shape[0])
                break
    shape = {"layers": layers, "heads": max(heads) if heads else 0, "width": width}
    for key in ("layers", "heads", "width"):
        if not shape[key]:
            shape[key] = int(th[f"assume_{key}"])
        else:
            told.append(key)
    shape["from_model"] = told
    return shape


def fit_peaks(lengths: list[int], peaks: list[int]) -> dict[str, Any] | None:
    """Non-negative least squares peak(T) ~ a + b T + c T^2 over measured (length, peak) pairs.

    Attention scores grow ~T^2, activations and logits ~T, buffers are constant; non-negative
    coefficients keep rounding in small measurements from bending the curve down at long T.
    None with fewer than two distinct lengths.
    """
    from scipy.optimize import nnls

    if len(set(lengths)) < 2:
        return None
    t = np.asarray(lengths, np.float64)
    y = np.asarray(peaks, np.float64)
    scale = np.array([1.0, t.max(), t.max() ** 2])  # well-conditioned columns
    coef, _ = nnls(np.stack([np.ones_like(t), t / scale[1], t ** 2 / scale[2]], axis=1), y)
    a, b, c = (float(x) for x in coef / scale)
    return {"a": a, "b": b, "c": c, "lengths": [int(x) for x in lengths], "peaks": [int(x) for x in peaks]}


def predict_bytes(fit: dict[str, Any], length: int) -> int:
    return int(fit["a"] + fit["b"] * length + fit["c"] * length * length)


def longest_fitting(fit: dict[str, Any], budget: float) -> int:
    """The largest T with a + b T + c T^2 <= budget (0 if none)."""
    a, b, c = fit["a"], fit["b"], fit["c"]
    if budget < a:
        return 0
    if c > 0:
        return int((-b + math.sqrt(b * b + 4 * c * (budget - a))) / (2 * c))
    return int((budget - a) / b) if b > 0 else 1 << 30


def floor_bytes(length: int, vocab: int, shape: dict[str, Any]) -> int:
    """What one copy of the logits and (where the model tells its shape) of the attention scores
    take: a physical lower bound, so a flat fit of small peaks cannot wave a huge length through."""
    t = int(length)
    attention = (shape["layers"] * shape["heads"] * t * t
                 if {"layers", "heads"} <= set(shape.get("from_model", [])) else 0)
    return int((t * vocab + attention) * 4)


def estimate_bytes(length: int, vocab: int, n_params: int, shape: dict[str, Any],
                   th: dict[str, Any]) -> int:
    """Conservative bytes needed for forward + backward on one sequence of `length` tokens."""
    t, f32 = int(length), 4
    logits = th["memory_logits_copies"] * t * vocab * f32
    attention = th["memory_attention_copies"] * shape["layers"] * shape["heads"] * t * t * f32
    activations = th["memory_activation_copies"] * shape["layers"] * t * shape["width"] * f32
    return int(logits + attention + activations + 3 * n_params * f32)
