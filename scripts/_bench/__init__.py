"""What `scripts/benchmark.py` is made of, one concept per module.

`names` (known before TensorFlow is imported), `workloads`, `measure` (the `System` interface and the timers),
`ours` (tfbuffers' systems, generated from `tfbuffers.kinds` and its variants), `peers` (TF-Agents, cpprb),
`limits` (references that store or check nothing more than they must), `systems` (all of them, in the tables'
order), `actors` (processes adding to one shared buffer), `flashbax` (its process), `report` (tables and plot).
"""
