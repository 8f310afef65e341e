"""Devices that come and go: per-device speed, links, availability and dropouts as arrays
(:mod:`lcfed.devices.fleet`, made by :mod:`lcfed.devices.generators`), read from FedScale's trace formats
(:mod:`lcfed.devices.traces`), the simulated clock's records (:mod:`lcfed.devices.clock`), and the round's
schedule on that clock, synchronous (:mod:`lcfed.devices.schedule`) or buffered (:mod:`lcfed.devices.buffered`).
Arrays and pure functions of (seed, round): the schedulers read the config and the round's types, and no method."""
