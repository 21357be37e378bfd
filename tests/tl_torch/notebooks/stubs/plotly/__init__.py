"""Stand-in for plotly: the notebooks' figures are recorded, not drawn (display_record.py)."""
