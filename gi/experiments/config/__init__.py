"""The commands' config schemas, one module per command (docs/architecture.md, "Layout"): each holds its
dataclasses, their validation and the loading steps :func:`gi.core.config.load` calls; the computation is the
command's module in :mod:`gi.experiments`, its file output the command's ``*_output`` module."""
