"""Stand-in for PySvelte (not on PyPI): recorded, not drawn (display_record.py)."""
from display_record import recorder

TopKTable = recorder("pysvelte.TopKTable")
