"""Stand-in for circuitsvis: what would be drawn is recorded (display_record.py)."""
from . import attention, examples  # noqa: F401
