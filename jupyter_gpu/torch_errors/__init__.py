"""How PyTorch and its libraries word their errors, one table each, for every feature that must recognise them:
running out of memory (`oom`) and a device/dtype mismatch (`mismatch`). Pure Python."""
