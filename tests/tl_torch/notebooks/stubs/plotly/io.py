class _Renderers:
    default = "notebook"


renderers = _Renderers()
