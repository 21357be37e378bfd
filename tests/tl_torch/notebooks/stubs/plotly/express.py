from display_record import recorder

imshow = recorder("px.imshow")
line = recorder("px.line")
scatter = recorder("px.scatter")
histogram = recorder("px.histogram")
bar = recorder("px.bar")
