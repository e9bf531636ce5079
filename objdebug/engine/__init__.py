"""The engine: everything that turns a target and data into MindSpore calls.

`runtime` (device, mode, seed), `target` (factories, strict checkpoint load), `data` and
`datasets` (tokenizing, rows, labels, buckets), `cells` (the only Cells that call the user's
objective), `gradients` (in-graph gradient statistics), `compile_cache` and `core.Engine`
(compiled, reusable evaluation). Stages ask the engine; they never build graphs of their own
shape policy. Importing this package does not import MindSpore.
"""
