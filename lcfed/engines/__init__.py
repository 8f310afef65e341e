"""Engines: what hosts a run's devices and server. :mod:`lcfed.engines.local` runs them in this
process (the reference every engine must match number for number); the Ray engine is
:mod:`actors.ray_engine`. Both drive the one round loop, :func:`lcfed.loop.run_rounds`."""
