"""`phase6 plan`: predict memory, communication, step time and serving latency before renting anything.

Public API (formulas and sources in docs/cost_model.md):
- ``ModelSpec`` / ``resolve_model``: shapes, parameter counts, FLOPs/token, KV bytes/token (model.py)
- ``train_memory`` / ``serve_memory``: bytes per GPU (memory.py); collective costs (comm.py)
- ``predict_train_step``: step time of one parallel layout (train.py)
- ``predict_pretrain`` / ``predict_loss``: 6A tokens/s, MFU, memory DDP vs FSDP2, L(N, D) band (pretrain.py)
- ``ServeCostModel`` / ``serve_latency``: prefill and decode step times (serve.py), used by 6B and `phase6 fleet`
- ``recommend_train`` / ``recommend_serve``: ranked parallel layouts (recommend.py)
Nothing here imports torch except calibrate.py.
"""
