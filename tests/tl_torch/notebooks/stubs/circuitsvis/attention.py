from display_record import recorder

attention_heads = recorder("cv.attention.attention_heads")
attention_pattern = recorder("cv.attention.attention_pattern")
attention_patterns = recorder("cv.attention.attention_patterns")
