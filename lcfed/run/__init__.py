"""The run: one config's federation from setup to result, the same on every engine. The setup built once
(:mod:`~lcfed.run.setup`: data, partition, model; its data sources and host shards beside it), the round
loop written once (:mod:`~lcfed.run.loop`) and the Protocols it calls (:mod:`~lcfed.run.contracts`), what it
returns (:mod:`~lcfed.run.result`), the per-round metric catalog, checkpoints, the stop request, a lost
cluster's fault, the progress observer and output paths proven to hold files. Above the methods, the data and
the device model, below the engines that host a run and the API that starts one.
"""
