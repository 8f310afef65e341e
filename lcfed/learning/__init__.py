"""The learning pieces every method and engine composes: the models (:mod:`~lcfed.learning.models`, each with
its embedding/decision split), the one local SGD update with its proximal pulls
(:mod:`~lcfed.learning.local_update`) and its vmapped form (:mod:`~lcfed.learning.vectorized`), model
similarity and clustering steps (:mod:`~lcfed.learning.similarity`, :mod:`~lcfed.learning.clustering`), and
the measures of a run: accuracy and homogeneity (:mod:`~lcfed.learning.metrics`), cluster recovery
(:mod:`~lcfed.learning.recovery`), statistics over seeds (:mod:`~lcfed.learning.stats`). Pure PyTorch,
NumPy and SciPy on tensors and arrays: nothing here knows the config, a method or a run.
"""
