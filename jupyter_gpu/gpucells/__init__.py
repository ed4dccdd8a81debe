"""`%gpucells`: which of my cells used the GPU, for how long and how much memory, without wrapping a cell.

Pure: the rows come from the activity recorder (magics/activity.py, measured by probekit/cell_meter.py); this room
flags them (`log`) and renders them (`render`).
"""
