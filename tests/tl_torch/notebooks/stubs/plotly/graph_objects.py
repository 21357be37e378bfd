from display_record import recorder

Figure = recorder("go.Figure")
Heatmap = recorder("go.Heatmap")
Scatter = recorder("go.Scatter")
