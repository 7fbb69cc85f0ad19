"""The command-line entry points, the top layer: ``hoprl`` (:mod:`cli.main`) and its ``pipeline``
command (:mod:`cli.pipeline`).

They sit above everything else, so they may import the library (``hoprl``), the services (to start
them in-process) and the flows; nothing below imports them (``tests/test_layers.py``).
"""
