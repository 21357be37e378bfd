"""Stand-in for Neel Nanda's plotting helpers: recorded, not drawn (display_record.py)."""
from display_record import recorder

line = recorder("neel_plotly.line")
imshow = recorder("neel_plotly.imshow")
scatter = recorder("neel_plotly.scatter")
