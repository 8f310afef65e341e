"""Devices that come and go: per-device speed, links, availability and dropouts as arrays
(:mod:`lcfed.devices.fleet`), read from FedScale's trace formats (:mod:`lcfed.devices.traces`), and the
round's schedule on a simulated clock (:mod:`lcfed.devices.schedule`)."""
