"""Federated learning itself: real datasets and their partition into clients, the papers' models (and
many copies of one in a single pass), attacks, the fairness metrics, the min-norm QP, server step
sizes, the messages between clients and server, and the algorithms, one module per paper's family
(``fairfl.federated.algorithms.fedmgda``...)."""
