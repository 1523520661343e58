"""A cluster of hosts on one machine, for faults across hosts: each host is a network namespace.

``hosts`` builds the namespaces, their switch and the faults a network has (partitions, loss, a host that
vanishes); ``balancer`` is the load balancer in front of the store servers (and the latency, which this kernel's
missing ``netem`` cannot add); ``writer`` is a client that logs every write the store acknowledged; ``audit``
checks, from the database alone, what must hold after the faults; ``scenario`` runs a training run through it all.
"""
