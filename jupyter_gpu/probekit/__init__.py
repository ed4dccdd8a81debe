"""What three or more features share to measure the user's code: the training-object finder and state snapshot,
the progress ticker, the device clock, the live-storage scan and the last error's release.

A room of its own: it imports no feature's room, and each feature imports from it (checked by
tests/test_architecture.py).
"""
