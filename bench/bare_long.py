"""Bare MindSpore forward + backward at one long length: the reference for objdebug's peak there.

The same model factory, checkpoint and objective as an objdebug target, one `value_and_grad`
Cell on a [1, T] batch of ids, GRAPH_MODE on CPU; prints the process's max RSS (ru_maxrss) and
the peak the call added. Not run in CI (bench/README.md).

    PYTHONPATH=. python bench/bare_long.py fixtures/targets/llama_ce/objdebug.toml 2048
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main(config: str, length: int) -> dict:
    import numpy as np
    import mindspore as ms
    from mindspore import nn

    from objdebug.core.config import load_config
    from objdebug.engine.target import import_factory

    cfg = load_config(config)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(cfg.run.device)
    ms.set_seed(cfg.run.seed)
    model = import_factory(cfg.model.factory, "model", cfg.base_dir)(**cfg.model.kwargs)
    if cfg.model.checkpoint:
        ms.load_param_into_net(model, ms.load_checkpoint(str(cfg.model.checkpoint)))
    loss = import_factory(cfg.objective.factory, "objective", cfg.base_dir)(**cfg.objective.kwargs)
    model.set_train(False)
    flat = cfg.objective.call == "flat"

    class Net(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.model, self.loss = model, loss

        def construct(self, ids, labels):
            logits = self.model(ids)
            if flat:
                return self.loss(logits.reshape((-1, logits.shape[-1])), labels.reshape((-1,)))
            return self.loss(logits, labels)

    grad = ms.value_and_grad(Net(), None, model.trainable_params())
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 256, size=(1, length)).astype(np.int32)
    labels = np.concatenate([ids[:, 1:], np.full((1, 1), -100, np.int32)], axis=1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t = time.perf_counter()
    value, _ = grad(ms.Tensor(ids), ms.Tensor(labels))
    value = float(value.asnumpy())
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"length": length, "loss": value, "seconds": seconds, "max_rss_bytes": peak,
            "before_bytes": before}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
