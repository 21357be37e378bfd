from display_record import recorder

hello = recorder("cv.examples.hello")
