"""Native CPU kernels and what they need: the int4 matmul, one op per decoder layer, the
build of the C++ sources in ``csrc/``, huge-page weight storage and the off switches."""
