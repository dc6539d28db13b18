"""Weight-only quantisation: int8 / int4 layers (``layers``), the int4 weight layout
(``int4_weight``) and turning a loaded model into a quantised one (``quantize``)."""
