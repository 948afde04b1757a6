"""The parts of ``poptorch.Options`` (``poptorch/options.py``), one module per
concept: value validation and storage, the options the emulator does not act on,
and each option group (``opts.Training``, ``opts.Precision``,
``opts.TensorLocations``, ``opts.Jit`` and ``opts._Popart``, ``opts.Distributed``)."""
